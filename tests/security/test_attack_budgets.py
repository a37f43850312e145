"""Route (issue 24, item 6): budgets and limits nobody can mean (`usd: -5`, `wall_s: -1`,
`usd: .inf`) were accepted; each entry now refuses them with one line, through one check."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.batch.file import BatchInputError, load_entries
from fleet.errors import ConfigError, FleetError, InvalidLimit
from fleet.limits.budget import Budget
from fleet.llm.config import load_config
from fleet.presets import load_preset_file
from fleetops.cli.main import main

BAD = [
    pytest.param("usd", -5, "greater than 0", id="usd-negative"),
    pytest.param("usd", 0, "greater than 0", id="usd-zero"),
    pytest.param("usd", float("inf"), "finite", id="usd-inf"),
    pytest.param("usd", float("nan"), "finite|number", id="usd-nan"),  # some loaders: a string
    pytest.param("wall_s", -1, "greater than 0", id="wall-negative"),
    pytest.param("wall_s", float("inf"), "finite", id="wall-inf"),
    pytest.param("tokens", -1, "greater than 0", id="tokens-negative"),
    pytest.param("tokens", 0, "greater than 0", id="tokens-zero"),
    pytest.param("sub_agents", -2, "greater than or equal to 0", id="sub-agents-negative"),
    pytest.param("depth", -1, "greater than or equal to 0", id="depth-negative"),
    pytest.param("tokens", True, "integer", id="tokens-bool"),
]
"""(field, value, what the message says) for every entry below."""
YAML = {float("inf"): ".inf", float("nan"): ".nan", True: "true"}


def yaml_value(value: object) -> str:
    """How the value is spelled in YAML (`.inf`, `.nan`, `true`)."""
    return YAML.get(value, str(value))  # type: ignore[call-overload, no-any-return]


@pytest.mark.parametrize(("field", "value", "rule"), BAD)
def test_the_python_api_raises_a_typed_error(field: str, value: object, rule: str) -> None:
    with pytest.raises(InvalidLimit, match=rule) as refused:
        Budget(**{field: value})  # type: ignore[arg-type]
    assert isinstance(refused.value, FleetError)
    assert str(refused.value).startswith(f"budget.{field}: ") and "\n" not in str(refused.value)


@pytest.mark.parametrize(("field", "value", "rule"), BAD)
def test_a_batch_entry_is_refused_with_its_line(
    tmp_path: Path, field: str, value: object, rule: str
) -> None:
    batch = tmp_path / "batch.yaml"
    bad = f"{{{field}: {yaml_value(value)}}}"
    batch.write_text(f"- task: fine\n  budget: {{usd: 1}}\n- task: bad\n  budget: {bad}\n")
    with pytest.raises(BatchInputError, match=rule) as refused:
        load_entries(batch)
    assert f"{batch}:3:" in str(refused.value) and field in str(refused.value)


@pytest.mark.parametrize(("field", "value", "rule"), BAD)
def test_a_preset_file_is_refused(tmp_path: Path, field: str, value: object, rule: str) -> None:
    preset = tmp_path / "spender.md"
    preset.write_text(f"---\nbudget: {{{field}: {yaml_value(value)}}}\n---\nSpend.\n")
    with pytest.raises(ConfigError, match=rule) as refused:
        load_preset_file(preset)
    assert str(preset) in str(refused.value) and field in str(refused.value)


@pytest.mark.parametrize(
    ("limit", "value"),
    [("requests_per_minute", "-5"), ("tokens_per_minute", ".inf"), ("max_concurrency", "0")]
    + [("requests_per_minute", ".nan"), ("max_concurrency", "true")],
)
def test_fleet_yaml_limits_are_refused(tmp_path: Path, limit: str, value: str) -> None:
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "providers:\n  local: {kind: openai, base_url: 'http://127.0.0.1:9/v1',"
        f" limits: {{{limit}: {value}}}}}\n"
    )
    with pytest.raises(ConfigError, match=limit):
        load_config(config, env={})


@pytest.mark.parametrize("price", ["-3.0", ".inf", ".nan"])
def test_a_negative_or_infinite_price_is_refused(tmp_path: Path, price: str) -> None:
    """A negative price would pay a tree back for every call it makes, past any usd budget."""
    config = tmp_path / "fleet.yaml"
    config.write_text(
        f"models:\n  m: {{provider: openai, name: gpt-4o-mini, input_usd_per_mtok: {price}}}\n"
    )
    with pytest.raises(ConfigError, match="input_usd_per_mtok"):
        load_config(config, env={})


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--budget-usd", "-5"), ("--budget-usd", "inf"), ("--budget-usd", "nan")]
    + [("--budget-wall-s", "-1"), ("--budget-tokens", "0"), ("--budget-sub-agents", "-1")],
)
def test_the_cli_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    code = main(["run", flag, value, "spend it all"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"fleet: error: {flag}: must be"), err
    assert "Traceback" not in err


def test_valid_budgets_still_pass(tmp_path: Path) -> None:
    assert Budget(tokens=1, usd=0.5, sub_agents=0, depth=0, wall_s=30).depth == 0
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"task": "x", "budget": {"usd": 2, "wall_s": 1.5, "sub_agents": 0}}\n')
    assert load_entries(batch)[0].budget == Budget(usd=2.0, wall_s=1.5, sub_agents=0)


@pytest.mark.parametrize("width", [0, -2, True], ids=["zero", "negative", "bool"])
def test_the_python_api_refuses_a_width_nobody_can_mean(tmp_path: Path, width: int) -> None:
    from dataclasses import replace as with_

    from fleet.conversation.roots import TaskSpec, create_root
    from fleet.inprocess import InProcessDispatcher
    from fleet.runtime import Runtime
    from fleet.settings import Settings
    from fleet.storage.backends.memory.store import MemoryStore
    from fleet.testing import ScriptedModel

    store = MemoryStore()
    settings = Settings(workspace=tmp_path, env={})
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"t": ScriptedModel()})
    spec = with_(TaskSpec("survey", model="t"), max_concurrent=width)
    with pytest.raises(
        InvalidLimit, match=r"^max_concurrent: must be (greater than 0|a valid integer)"
    ):
        create_root(runtime, spec)
    assert store.list_traces() == [], "nothing written"
