"""Route 6: the result cache cannot cross trees it should not.

Attacks (each answered from the wrong entry on main):
- a tree in workspace B got tree A's cached answer (the key was preset + arguments only);
- the same call on another model, or after the preset file changed, got the old answer;
- seed-style `keys: [city, forecast_type]` read as null in every call, so a Paris query was
  answered with Beijing's result; unknown key names were not rejected.
Controls: `fleet.children.cache.cache_key` hashes the workspace, the child's model and tool ceiling
and `AgentPreset.fingerprint()` with the chosen arguments; `load_preset_file` rejects a
`cache.keys` name that is not an `agent` argument (`ConfigError` naming it), and
`context.FIELD` selects one field of the call's `context`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.errors import ConfigError
from fleet.inprocess import InProcessFleet
from fleet.llm.base import LLMResponse
from fleet.presets import load_presets
from fleet.settings import Settings
from fleet.storage.backends.memory.store import MemoryStore
from fleet.testing import ScriptedModel, call, text


def _task(messages: list[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in messages if m["role"] == "user")


def _weather_model(context: dict[str, str] | None = None) -> ScriptedModel:
    """The root asks the `weather` sub-agent; the sub-agent answers from what it is given."""

    def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        task = _task(messages)
        if task.startswith("forecast"):
            where = next((str(m["content"]) for m in messages if "city" in str(m["content"])), "")
            return text(f"answer for {task} in {where[-40:]}")
        if sum(m["role"] == "assistant" for m in messages) == 0:
            return call("agent", task="forecast", agent_type="weather", context=context or {})
        return text(str(messages[-1]["content"]))

    return ScriptedModel(function=respond)


def _agents(tmp_path: Path, keys: str, prompt: str = "Forecast.") -> Path:
    agents = tmp_path / "agents"
    agents.mkdir(exist_ok=True)
    (agents / "weather.md").write_text(
        f"---\nname: weather\ndescription: forecasts\ntools: [read_file]\n"
        f"cache: {{ttl_s: 600, keys: {keys}}}\n---\n{prompt}\n"
    )
    return agents


def _run(
    store: MemoryStore, workspace: Path, agents: Path, model: ScriptedModel, name: str = "test"
) -> tuple[InProcessFleet, str]:
    workspace.mkdir(exist_ok=True)
    settings = Settings(workspace=workspace, agents_dir=agents, env={})
    local = InProcessFleet.from_settings(settings, store=store, clients={name: model})
    trace = local.run("ask the weather", model=name)
    return local, trace.trace_id


def _was_cached(local: InProcessFleet, trace_id: str) -> bool:
    """A hit answers the call without starting a sub-agent."""
    return local.store.children(trace_id) == []


def test_a_tree_in_another_workspace_misses_the_cache(tmp_path: Path) -> None:
    store, agents = MemoryStore(), _agents(tmp_path, "[task]")
    first = _run(store, tmp_path / "a", agents, _weather_model())
    again = _run(store, tmp_path / "a", agents, _weather_model())
    other = _run(store, tmp_path / "b", agents, _weather_model())
    assert not _was_cached(*first) and _was_cached(*again), "same workspace: a hit"
    assert not _was_cached(*other), "workspace b never sees workspace a's answer"


def test_another_model_or_a_changed_preset_misses_the_cache(tmp_path: Path) -> None:
    store = MemoryStore()
    _run(store, tmp_path / "a", _agents(tmp_path, "[task]"), _weather_model())
    other_model = _run(store, tmp_path / "a", tmp_path / "agents", _weather_model(), "test2")
    assert not _was_cached(*other_model)
    changed = _agents(tmp_path, "[task]", prompt="Forecast, and lie about Paris.")
    assert not _was_cached(*_run(store, tmp_path / "a", changed, _weather_model()))


def test_context_fields_select_the_named_arguments(tmp_path: Path) -> None:
    store, agents = MemoryStore(), _agents(tmp_path, "[task, context.city, context.forecast_type]")
    beijing = {"city": "Beijing", "forecast_type": "today"}
    paris = {"city": "Paris", "forecast_type": "today"}
    _run(store, tmp_path / "a", agents, _weather_model(beijing))
    local, trace_id = _run(store, tmp_path / "a", agents, _weather_model(paris))
    assert not _was_cached(local, trace_id), "Paris is not answered with Beijing's result"
    assert "Paris" in (local.store.get_trace(trace_id).answer or "")
    assert _was_cached(*_run(store, tmp_path / "a", agents, _weather_model(paris)))


@pytest.mark.parametrize("keys", ["[city, forecast_type]", "[task, tsak]", "[context.]"])
def test_unknown_cache_key_names_are_a_config_error(tmp_path: Path, keys: str) -> None:
    agents = _agents(tmp_path, keys)
    with pytest.raises(ConfigError, match=r"weather\.md: cache\.keys: unknown argument '"):
        load_presets(agents, {})
