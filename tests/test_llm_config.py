"""fleet.yaml loading, model-name resolution and client construction."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.llm.anthropic import AnthropicClient
from fleet.llm.clients import make_client, validate_model
from fleet.llm.config import (
    FleetConfig,
    ModelTarget,
    load_config,
    resolve_model_name,
    resolve_target,
)
from fleet.llm.openai import OpenAIClient
from fleet.llm.pricing import ModelPricing

KEY = "sk-config-SECRET-42"

FLEET_YAML = """\
providers:
  local: {kind: openai, base_url: "http://127.0.0.1:11434/v1"}
  router: {kind: openai, base_url: "https://openrouter.ai/api/v1", api_key_env: ROUTER_KEY}
models:
  fast: {provider: openai, name: gpt-4o-mini}
  smart: {provider: anthropic, name: claude-sonnet-4-5,
          input_usd_per_mtok: 2.0, output_usd_per_mtok: 10.0}
  tiny: {provider: local, name: "qwen2.5:0.5b"}
default_model: fast
model_overrides:
  reviewer: smart
"""


@pytest.fixture
def config(tmp_path: Path) -> FleetConfig:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML)
    return load_config(path, env={}, key_envs=frozenset({"ROUTER_KEY"}))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_defaults_without_a_file_have_the_builtin_providers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    config = load_config(env={})

    assert config.models == {}
    assert config.default_model is None
    assert config.providers["openai"].base_url == "https://api.openai.com/v1"
    assert config.providers["openai"].api_key_env == "OPENAI_API_KEY"
    assert config.providers["anthropic"].base_url == "https://api.anthropic.com"
    assert config.providers["anthropic"].api_key_env == "ANTHROPIC_API_KEY"


def test_base_url_env_vars_move_the_builtin_providers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1", "ANTHROPIC_BASE_URL": "http://p:1"}

    config = load_config(env=env)

    assert config.providers["openai"].base_url == "http://127.0.0.1:8000/v1"
    assert config.providers["anthropic"].base_url == "http://p:1"


def test_file_is_found_explicitly_then_via_env_never_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    explicit = write(tmp_path / "a", "default_model: openai:explicit\n")
    from_env = write(tmp_path / "b", "default_model: openai:from-env\n")
    write(tmp_path, "default_model: openai:from-cwd\n")
    monkeypatch.chdir(tmp_path)
    env = {"FLEET_CONFIG": str(from_env)}

    assert load_config(explicit, env=env).default_model == "openai:explicit"
    assert load_config(env=env).default_model == "openai:from-env"
    assert load_config(env={}).default_model is None  # ./fleet.yaml may be an agent's


def test_a_named_file_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(env={"FLEET_CONFIG": str(tmp_path / "missing.yaml")})


def test_malformed_yaml_names_file_line_and_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "models:\n  fast: {provider: openai\n  other: 1\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})

    message = str(caught.value)
    assert message.startswith(f"{path}: line 3, column ")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n- b\n", "top level: expected a mapping, got list"),
        ("models:\n  fast: {name: gpt-4o}\n", "models.fast.provider: Field required"),
        (
            "providers:\n  p: {kind: grpc, base_url: x}\n",
            "providers.p.kind: Input should be 'openai' or 'anthropic'",
        ),
        ("models:\n  fast: {provider: openai, name: [1]}\n", "models.fast.name: Input should be"),
        (
            "models:\n  fast: {provider: nope, name: m}\n",
            "models.fast.provider: unknown provider 'nope' (known: anthropic, openai, scripted)",
        ),
        (
            "providers:\n  p: {kind: openai, base_url: x, limits: {jitter_margin_ms: -5}}\n",
            "providers.p.limits.jitter_margin_ms: Input should be greater than or equal to 0",
        ),
        (
            "providers:\n  p: {kind: openai, base_url: x, limits: {jitter_margin_ms: 5000}}\n",
            "providers.p.limits.jitter_margin_ms: Input should be less than or equal to 1000",
        ),
    ],
)
def test_wrong_shapes_are_one_line_errors_saying_where(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)

    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})

    assert str(caught.value).startswith(f"{path}: {expected}")
    assert "\n" not in str(caught.value)


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""), env={})

    assert set(config.providers) == {"openai", "anthropic"}


@pytest.mark.parametrize(
    ("explicit", "preset", "env", "expected"),
    [
        ("openai:gpt-4o", "reviewer", {"FLEET_MODEL": "tiny"}, "openai:gpt-4o"),
        (None, "reviewer", {"FLEET_MODEL": "tiny"}, "smart"),
        (None, "writer", {"FLEET_MODEL": "tiny"}, "tiny"),
        (None, None, {"FLEET_MODEL": "tiny"}, "tiny"),
        (None, "writer", {}, "fast"),
        (None, None, {"FLEET_MODEL": ""}, "fast"),
    ],
)
def test_resolve_model_name_order(
    config: FleetConfig,
    explicit: str | None,
    preset: str | None,
    env: dict[str, str],
    expected: str,
) -> None:
    assert resolve_model_name(config, explicit, preset, env) == expected


def test_no_model_anywhere_says_how_to_set_one() -> None:
    with pytest.raises(ConfigError, match="FLEET_MODEL"):
        resolve_model_name(FleetConfig(), None, "writer", {})


def test_aliases_resolve_to_provider_model_and_prices(config: FleetConfig) -> None:
    assert resolve_target(config, "smart") == ModelTarget(
        provider="anthropic",
        kind="anthropic",
        model="claude-sonnet-4-5",
        base_url="https://api.anthropic.com",
        api_key_env="ANTHROPIC_API_KEY",
        pricing=ModelPricing(2.0, 10.0),
        batch_api=True,  # api.anthropic.com has Message Batches
    )
    assert not resolve_target(config, "tiny").batch_api  # a local server: only if it says so
    # Only the first colon separates the provider: Ollama tags keep theirs.
    assert resolve_target(config, "local:llama3.1:8b").model == "llama3.1:8b"
    assert resolve_target(config, "tiny").base_url == "http://127.0.0.1:11434/v1"


def test_make_client_builds_the_right_client_without_leaking_the_key(
    config: FleetConfig,
) -> None:
    env = {"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY}

    fast = make_client(config, "fast", env)
    smart = make_client(config, "anthropic:claude-haiku-4-5", env)

    assert isinstance(fast, OpenAIClient)
    assert (fast.base_url, fast.model) == ("https://api.openai.com/v1", "gpt-4o-mini")
    assert isinstance(smart, AnthropicClient)
    assert smart.model == "claude-haiku-4-5"
    assert KEY not in repr(fast) and KEY not in repr(smart)
    fast.close()
    smart.close()


@pytest.mark.parametrize("model_name", ["fast", "openai:gpt-4o"])
def test_missing_key_for_public_api_names_the_env_var(config: FleetConfig, model_name: str) -> None:
    for check in (validate_model, make_client):
        with pytest.raises(ConfigError, match="set OPENAI_API_KEY"):
            check(config, model_name, {})


def test_local_servers_need_no_key(config: FleetConfig) -> None:
    validate_model(config, "tiny", {})
    client = make_client(config, "tiny", {})

    assert isinstance(client, OpenAIClient)
    assert client.base_url == "http://127.0.0.1:11434/v1"
    client.close()


def test_a_non_public_provider_missing_its_key_fails_at_the_server_not_here(
    config: FleetConfig,
) -> None:
    # OpenRouter answers 401 itself, which the client turns into a ConfigError.
    validate_model(config, "router:openai/gpt-4o", {})


@pytest.mark.parametrize(
    ("model_name", "expected"),
    [
        ("gpt-4o", "unknown model 'gpt-4o': use provider:model"),
        ("mistral:large", "unknown provider 'mistral' in model 'mistral:large'"),
        ("openai:", "names no model"),
    ],
)
def test_unknown_names_are_config_errors(
    config: FleetConfig, model_name: str, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        validate_model(config, model_name, {"OPENAI_API_KEY": KEY})


def test_scripted_model_loads_from_file(config: FleetConfig, tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("scripts:\n  - match: '.*'\n    steps:\n      - content: done\n")

    client = make_client(config, f"scripted:{script}", {}, allow_scripted=True)

    assert client.complete([{"role": "user", "content": "go"}], []).content == "done"


def test_missing_script_is_caught_by_preflight(config: FleetConfig, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="scripted model file not found"):
        validate_model(config, f"scripted:{tmp_path / 'nope.yaml'}", {}, allow_scripted=True)


def test_a_key_with_a_trailing_newline_is_stripped_and_control_chars_refused() -> None:

    config = load_config(None, env={})
    client = make_client(config, "openai:gpt-4o-mini", {"OPENAI_API_KEY": "sk-abc\n"})
    assert "sk-abc" not in repr(client)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY contains control characters") as caught:
        make_client(config, "openai:gpt-4o-mini", {"OPENAI_API_KEY": "sk-a\x00bc"})
    assert "sk-a" not in str(caught.value)
