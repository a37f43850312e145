"""Building a model client from fleet.yaml: the one place an API key is read.

`validate_model` runs every check `make_client` runs without building anything (what
`fleet run` and `fleet doctor` need); `make_client` imports the HTTP clients only when a
real client is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fleet.errors import ConfigError
from fleet.llm.base import LLMClient
from fleet.llm.config import FleetConfig, ModelTarget, resolve_target
from fleet.llm.retry import DEFAULT_RETRY, RetryPolicy
from fleet.security import trust
from fleet.security.redact import Redactor

PUBLIC_API_HOSTS = frozenset({"api.openai.com", "api.anthropic.com"})
"""A provider at one of these hosts cannot work without a key, so a missing one fails early."""


def _api_key(target: ModelTarget, env: Mapping[str, str]) -> str:
    """The key from the environment; a public API without one is a `ConfigError`."""
    key = (env.get(target.api_key_env, "") if target.api_key_env else "").strip()
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise ConfigError(f"{target.api_key_env} contains control characters")
    if not key and urlparse(target.base_url).hostname in PUBLIC_API_HOSTS:
        how = (
            f"set {target.api_key_env}"
            if target.api_key_env
            else "give the provider an api_key_env in fleet.yaml"
        )
        raise ConfigError(f"provider {target.provider!r} needs an API key: {how}")
    return key


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
        trust.check_scripted_allowed(allow_scripted)
        if not Path(target.model).is_file():
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
        from fleet.llm.scripted import ScriptedModel  # only a scripted run needs it

        return ScriptedModel.from_file(Path(target.model))
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
