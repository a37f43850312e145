"""The model config: which providers exist, what model names mean, and which one to use.

`fleet.yaml` comes from the operator only: an explicit path, else `$FLEET_CONFIG`. There is
no fallback to `./fleet.yaml`, and a file inside a workspace root is refused: a worker's
working directory is a workspace, and an agent that can write a config there could point
the next runtime at its own endpoint with any variable as the key (see `fleet.security.trust`)::

    providers:
      local: {kind: openai, base_url: "http://localhost:11434/v1"}
      openrouter: {kind: openai, base_url: "https://openrouter.ai/api/v1",
                   api_key_env: OPENROUTER_API_KEY}
    models:
      fast: {provider: openai, name: gpt-4o-mini}
      smart: {provider: anthropic, name: claude-sonnet-4-5,
              input_usd_per_mtok: 3.0, output_usd_per_mtok: 15.0,
              cached_input_usd_per_mtok: 0.3, cache_write_usd_per_mtok: 3.75}
    default_model: fast
    model_overrides: {reviewer: smart}

A model name is an alias from `models` or `provider:model` (`openai:gpt-4o-mini`,
`anthropic:claude-sonnet-4-5`, `scripted:path/to/script.yaml`; the last only with
`FLEET_ALLOW_SCRIPTED=1`). The providers `openai` and `anthropic` are built in. API keys are
read from the environment only when a client is built, from variables named `*_API_KEY`
or listed in `FLEET_API_KEY_ENVS`, and appear in no repr, error or log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.config.approval_rules import ApproveEntry
from fleet.config.limits import PositiveCount, Price
from fleet.config.mcp import McpServerConfig, check_servers
from fleet.config.remote_agents import RemoteAgentConfig, check_remote_agents
from fleet.config.search import SearchConfig
from fleet.config.webfilter import WebSection
from fleet.errors import ConfigError
from fleet.llm.embeddings import ExperiencesSection, check_embedding_model
from fleet.llm.fallback import check_fallbacks
from fleet.llm.pricing import ModelPricing
from fleet.memory.config import FleetMemorySection
from fleet.security import trust, yamlsafe
from fleet.security.envvalues import config_path_of, model_of

CONFIG_FILE = "fleet.yaml"
SCRIPTED_PROVIDER = "scripted"

OPENAI_BASE_URL_ENV, OPENAI_DEFAULT_BASE_URL = "OPENAI_BASE_URL", "https://api.openai.com/v1"
ANTHROPIC_BASE_URL_ENV, ANTHROPIC_DEFAULT_BASE_URL = (
    "ANTHROPIC_BASE_URL",
    "https://api.anthropic.com",
)


class RateLimits(BaseModel):
    """`limits:` of a provider or model alias, shared by every worker through Redis."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: PositiveCount | None = None
    tokens_per_minute: PositiveCount | None = None
    """Input estimate plus `max_output_tokens` is booked before a call, the real usage after."""
    max_concurrency: PositiveCount | None = None
    """Calls in flight at once, fleet-wide."""
    jitter_margin_ms: int | None = Field(default=None, ge=0, le=1000)
    """How late a call may reach the provider and still fit its one-second window: the rates
    are paced that much slower per second (`fleet.limits.pacing`; None: 50 ms, 0: none; a
    second or more would halve them)."""


class ProviderConfig(BaseModel):
    """One entry of `providers`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["openai", "anthropic"]
    """Wire format: OpenAI-compatible `/chat/completions` or Anthropic Messages."""
    base_url: str
    api_key_env: str = ""
    """Env var holding the key; empty for a local server that needs none."""
    limits: RateLimits | None = None
    """For this provider and key, across every model of it."""
    batch_api: bool | None = None
    """The provider answers OpenAI's `/v1/batches` (kind openai) or Anthropic's
    `/v1/messages/batches` (kind anthropic). None: only api.openai.com and api.anthropic.com."""

    def has_batch_api(self) -> bool:
        """Whether `--batch-api` trees may use this provider."""
        if self.batch_api is not None:
            return self.batch_api
        return urlparse(self.base_url).hostname in trust.PUBLIC_API_HOSTS


class ModelConfig(BaseModel):
    """One entry of `models`: an alias for a provider's model, with optional prices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str
    name: str
    input_usd_per_mtok: Price | None = None
    output_usd_per_mtok: Price | None = None
    cached_input_usd_per_mtok: Price | None = None
    """Prompt tokens the provider's cache served; None: its share of the input price."""
    cache_write_usd_per_mtok: Price | None = None
    """Prompt tokens written to the cache (Anthropic); None: its share of the input price."""
    prompt_cache: bool = True
    """Cache breakpoints (Anthropic) or `prompt_cache_key` (OpenAI) on every request."""
    max_output_tokens: PositiveCount | None = None
    """Sent as `max_tokens` on every call; what a budget or token limit books for the answer."""
    limits: RateLimits | None = None
    """For this alias alone, on top of its provider's."""
    fallbacks: list[str] = Field(default_factory=list)
    """Aliases tried in order when a call to this one fails after its retries."""
    max_wait_s: float | None = Field(default=None, ge=0)
    """A provider pause (429) longer than this moves the trace to a fallback instead."""
    context_window: PositiveCount | None = None
    """Tokens the model takes per request; requests are fitted under `context_threshold`
    of it (`fleet.loop.fit`). None: requests are sent as built."""
    context_strategy: Literal["elide", "compact"] = "elide"
    """Past the threshold: `elide` old tool outputs in the request, or `compact` the trace
    through a side branch that summarises its main path (`fleet.loop.compact`)."""
    batch_input_usd_per_mtok: Price | None = None
    """Price of a prompt token sent through the provider's Batch API (None: half the live)."""
    batch_output_usd_per_mtok: Price | None = None
    """Price of an answer token through the Batch API (None: half the live price)."""
    batch_api: bool = False
    """Trees on this alias go through the provider's Batch API unless told otherwise."""
    vision: bool = True
    """Whether the model takes images: False refuses a call with one (it is never sent)."""


class FleetConfig(BaseModel):
    """The model section of `fleet.yaml`, built-in providers merged in."""

    # Other top-level sections of fleet.yaml belong to other parts of the fleet.
    model_config = ConfigDict(extra="ignore", frozen=True)

    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    default_model: str | None = None
    experiences: ExperiencesSection = ExperiencesSection()
    """How experiences are ranked: `embedding_model`, `min_similarity` (fleet.llm.embeddings)."""
    approve: tuple[ApproveEntry, ...] = ()
    """Tool calls that wait for a person's approval in every trace (on top of presets')."""
    memory: FleetMemorySection = FleetMemorySection()
    """Long-term memory's caps and the fleet-wide recorder policy (`fleet.memory.config`)."""
    model_overrides: dict[str, str] = Field(default_factory=dict)
    """Preset name -> model name, for presets that need a different model."""
    context_threshold: float = Field(default=0.8, gt=0.0, le=1.0)
    """Share of a model's `context_window` a request may fill before tool outputs are elided."""
    search: SearchConfig | None = None
    """The provider `web_search` asks (`fleet.tools.websearch`); None: no web_search."""
    web: WebSection = WebSection()
    """Domains web_search and web_fetch may touch (`fleet.config.webfilter`)."""
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    """MCP servers whose tools agents may use (`fleet.config.mcp`, docs/mcp.md)."""
    remote_agents: dict[str, RemoteAgentConfig] = Field(default_factory=dict)
    """A2A agents a tree may delegate to (`fleet.config.remote_agents`, docs/a2a.md)."""
    warm_explore: bool = False
    """Explore branches wait for the first one's first call (`fleet.children.warming`)."""


@dataclass(frozen=True)
class ModelTarget:
    """What a model name resolves to. Holds the key's env var name, never the key."""

    provider: str
    kind: Literal["openai", "anthropic", "scripted"]
    model: str
    """The provider's model name, or the script path for `scripted`."""
    base_url: str = ""
    api_key_env: str = ""
    pricing: ModelPricing | None = None
    batch_pricing: ModelPricing | None = None
    """The alias's own Batch API prices, if it sets them (else half of `pricing`)."""
    batch_api: bool = False
    """The provider has a Batch API (`ProviderConfig.has_batch_api`)."""
    prompt_cache: bool = True


def builtin_providers(env: Mapping[str, str]) -> dict[str, ProviderConfig]:
    """`openai` and `anthropic`, their base URLs overridable from the environment."""
    return {
        "openai": ProviderConfig(
            kind="openai",
            base_url=env.get(OPENAI_BASE_URL_ENV) or OPENAI_DEFAULT_BASE_URL,
            api_key_env="OPENAI_API_KEY",
        ),
        "anthropic": ProviderConfig(
            kind="anthropic",
            base_url=env.get(ANTHROPIC_BASE_URL_ENV) or ANTHROPIC_DEFAULT_BASE_URL,
            api_key_env="ANTHROPIC_API_KEY",
        ),
    }


def _config_path(path: Path | None, env: Mapping[str, str]) -> Path | None:
    """The operator's config: explicit, else `$FLEET_CONFIG`; never `./fleet.yaml`."""
    return path if path is not None else config_path_of(env)


def _validation_message(source: str, exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "top level"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {where}: {first['msg']}{more}"


def _check_key_envs(source: str, config: FleetConfig, allowed: frozenset[str]) -> None:
    for name, provider in config.providers.items():
        trust.check_key_env(f"{source}: providers.{name}", provider.api_key_env, allowed)
    if config.search is not None:
        trust.check_key_env(f"{source}: search", config.search.api_key_env, allowed)


def _check_model_providers(source: str, config: FleetConfig) -> None:
    known = {*config.providers, SCRIPTED_PROVIDER}
    for alias, model in config.models.items():
        if model.provider not in known:
            raise ConfigError(
                f"{source}: models.{alias}.provider: unknown provider {model.provider!r}"
                f" (known: {', '.join(sorted(known))})"
            )


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str],
    workspace_roots: tuple[Path, ...] = (),
    key_envs: frozenset[str] = frozenset(),
) -> FleetConfig:
    """Load `fleet.yaml`, or the defaults (built-in providers only) when there is none.

    Args:
        path: The operator's config file; else `$FLEET_CONFIG`; else none.
        env: Where `FLEET_CONFIG` and the base URL overrides are read (`Settings.env`).
        workspace_roots: A config file under one of these is refused.
        key_envs: `api_key_env` names allowed besides `*_API_KEY`.

    Raises:
        ConfigError: the file is missing (when named), inside a workspace root, malformed,
            of the wrong shape, or names a key variable that is not allowed; the message
            is one line, `<file>: <where>: <what>`.
    """
    found = _config_path(path, env)
    data: Any = None
    if found is not None:
        trust.check_config_path(found, workspace_roots)
        if not found.is_file():
            raise ConfigError(f"{found}: config file not found")
        data = yamlsafe.load_file(found)
    source = str(found or CONFIG_FILE)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level: expected a mapping, got {type(data).__name__}")
    try:
        config = FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_validation_message(source, exc)) from None
    _check_key_envs(source, config, key_envs)
    check_servers(source, config.mcp_servers)
    check_remote_agents(source, config.remote_agents)
    config = config.model_copy(update={"providers": {**builtin_providers(env), **config.providers}})
    _check_model_providers(source, config)
    check_embedding_model(
        source,
        config.experiences,
        {alias: model.provider for alias, model in config.models.items()},
        {name: provider.kind for name, provider in config.providers.items()},
    )
    check_fallbacks(source, config.models)
    return config


def resolve_model_name(
    config: FleetConfig,
    explicit: str | None,
    preset: str | None,
    env: Mapping[str, str],
) -> str:
    """The model to use: explicit, else the preset's override, else `$FLEET_MODEL`, else default.

    Raises:
        ConfigError: none of them is set.
    """
    override = config.model_overrides.get(preset) if preset else None
    name = explicit or override or model_of(env) or config.default_model
    if not name:
        raise ConfigError(
            "no model configured: pass --model, set FLEET_MODEL (e.g. openai:gpt-4o-mini),"
            " or set default_model in fleet.yaml"
        )
    return name


def _pricing(model: ModelConfig) -> ModelPricing | None:
    if model.input_usd_per_mtok is None and model.output_usd_per_mtok is None:
        return None
    return ModelPricing(
        model.input_usd_per_mtok or 0.0,
        model.output_usd_per_mtok or 0.0,
        model.cached_input_usd_per_mtok,
        model.cache_write_usd_per_mtok,
    )


def _batch_pricing(model: ModelConfig) -> ModelPricing | None:
    if model.batch_input_usd_per_mtok is None and model.batch_output_usd_per_mtok is None:
        return None
    return ModelPricing(
        model.batch_input_usd_per_mtok or 0.0, model.batch_output_usd_per_mtok or 0.0
    )


def resolve_target(config: FleetConfig, model_name: str) -> ModelTarget:
    """What `model_name` (an alias or `provider:model`) points at.

    Raises:
        ConfigError: unknown alias or provider, or an empty model part.
    """
    alias = config.models.get(model_name)
    cached = alias is None or alias.prompt_cache
    if alias is not None:
        provider_name, model, pricing = alias.provider, alias.name, _pricing(alias)
        batch_pricing = _batch_pricing(alias)
    elif ":" in model_name:
        provider_name, model = model_name.split(":", 1)
        pricing = batch_pricing = None
    else:
        aliases = ", ".join(sorted(config.models)) or "none"
        raise ConfigError(
            f"unknown model {model_name!r}: use provider:model (e.g. 'openai:gpt-4o-mini')"
            f" or an alias from models in fleet.yaml (aliases: {aliases})"
        )
    if not model:
        raise ConfigError(f"model {model_name!r} names no model after the provider")
    if provider_name == SCRIPTED_PROVIDER:
        return ModelTarget(provider=provider_name, kind="scripted", model=model)
    provider = config.providers.get(provider_name)
    if provider is None:
        known = ", ".join(sorted({*config.providers, SCRIPTED_PROVIDER}))
        raise ConfigError(
            f"unknown provider {provider_name!r} in model {model_name!r} (known: {known})"
        )
    return ModelTarget(
        provider=provider_name,
        kind=provider.kind,
        model=model,
        base_url=provider.base_url,
        api_key_env=provider.api_key_env,
        pricing=pricing,
        prompt_cache=cached,
        batch_pricing=batch_pricing,
        batch_api=provider.has_batch_api(),
    )
