"""Building a model client from fleet.yaml: the one place an API key is read.

`validate_model` runs every check `make_client` runs without building anything (what
`fleet run` and `fleet doctor` need); `make_client` imports the HTTP clients only when a
real client is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleet.errors import ConfigError
from fleet.llm.base import LLMClient
from fleet.llm.config import FleetConfig, ModelTarget, resolve_target
from fleet.llm.retry import DEFAULT_RETRY, RetryPolicy
from fleet.security import trust
from fleet.security.redact import Redactor


def _api_key(target: ModelTarget, env: Mapping[str, str]) -> str:
    """The key from the environment (`trust.api_key`: a public API needs one)."""
    return trust.api_key(env, target.api_key_env, target.base_url, target.provider)


def provider_key(target: ModelTarget, env: Mapping[str, str]) -> str:
    """The provider's API key from `env` (`ConfigError` as `make_client` would raise)."""
    return _api_key(target, env)


def validate_model(
    config: FleetConfig,
    model_name: str,
    env: Mapping[str, str],
    *,
    allow_scripted: bool = False,
) -> None:
    """Run every check `make_client` runs, without building a client or touching the network.

    Raises:
        ConfigError: what `make_client` would raise.
    """
    target = resolve_target(config, model_name)
    if target.kind == "scripted":
        from fleet.llm.scripted import script_file  # only a scripted model needs it

        trust.check_scripted_allowed(allow_scripted)
        if not script_file(target.model).is_file():
            raise ConfigError(f"scripted model file not found: {target.model!r}")
        return
    _api_key(target, env)


def make_client(
    config: FleetConfig,
    model_name: str,
    env: Mapping[str, str],
    *,
    allow_scripted: bool = False,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> LLMClient:
    """A client for `model_name`; the API key is read from `env` here and only here.

    Raises:
        ConfigError: unknown alias or provider, missing key, missing script file,
            or a scripted model while they are disabled.
    """
    validate_model(config, model_name, env, allow_scripted=allow_scripted)
    target = resolve_target(config, model_name)
    if target.kind == "scripted":
        from fleet.llm.scripted import ScriptedModel, script_file  # only a scripted run

        return ScriptedModel.from_file(script_file(target.model))
    # The HTTP clients (httpx) only here: `fleet run` reads this config but calls no model.
    from fleet.llm.anthropic import AnthropicClient
    from fleet.llm.openai import OpenAIClient

    options: dict[str, Any] = {
        "pricing": target.pricing,
        "provider": target.provider,
        "api_key_env": target.api_key_env,
        "redactor": Redactor.from_env(env),  # every secret of the process, not just this key
        "retry": retry,
        "prompt_cache": target.prompt_cache,
    }
    client = AnthropicClient if target.kind == "anthropic" else OpenAIClient
    return client(target.base_url, _api_key(target, env), target.model, **options)
