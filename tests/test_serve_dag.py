"""The plan as a graph: `GET /api/traces/{id}/dag` and the page's Plan view.

A scripted root plans two goals, spawns a sub-agent under the first, finishes it, abandons
the second; then a rewind leaves the second goal's messages on a branch off the main path.
The DAG is checked over every store, then the Plan view in a real headless Chromium.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from selenium import webdriver
from selenium.webdriver.common.by import By

from fleet.inprocess import InProcessDispatcher
from fleet.llm.base import LLMResponse
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.store import TraceStore
from fleet.testing import ScriptedModel, call, text
from fleetops.serve.dag import trace_dag
from tests.browserkit import screenshot, script_errors
from tests.servekit import LocalActions, page_config, serving
from tests.test_serve_page_views import waiter

PLAN = [
    call("goal", action="add", description="survey the code"),
    call("agent", task=["look at a"]),
    call("goal", action="add", description="rewrite it in <b>rust</b>"),
    call("goal", action="done", goal_id="1", summary="surveyed"),
    call("goal", action="abandon", goal_id="2", summary="too big"),
    text("done"),
]


def respond(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    users = [m for m in messages if m["role"] == "user"]
    if str(users[0]["content"]).startswith("look at"):
        return text("seen a")
    if str(users[-1]["content"]) == "try another way":
        return text("done another way")
    return PLAN[sum(1 for m in messages if m["role"] == "assistant")]


def planned(store: TraceStore, workspace: Path) -> tuple[LocalActions, str, int]:
    """The root run to its end, then rewound past the first goal; (actions, root, point)."""
    settings = Settings(workspace=workspace, env={})
    model = ScriptedModel(function=respond)
    actions = LocalActions(
        Runtime.build(settings, store, InProcessDispatcher(), clients={"m": model})
    )
    root = actions.run("plan the work", model="m")
    assert root.status == "completed", root.error
    messages = store.messages(root.trace_id)
    spawn = next(
        m for m in messages if m.tool_calls and m.tool_calls[0]["function"]["name"] == "agent"
    )
    point = next(m.sequence for m in messages if m.parent_sequence == spawn.sequence)  # its result
    return actions, root.trace_id, point


def test_the_dag_groups_messages_by_goal_and_greys_abandoned_and_rewound(
    store: TraceStore, tmp_path: Path
) -> None:
    actions, root, point = planned(store, tmp_path)
    before = trace_dag(store, root)
    first, second = before["goals"]
    assert (first["id"], first["status"], first["greyed"]) == ("1", "done", False)
    assert (second["status"], second["greyed"], second["rewound"]) == ("abandoned", True, False)
    assert first["sub_agents"] == store.children(root), "the sub-agent hangs under goal 1"
    assert first["messages"] and second["messages"]
    assert set(first["messages"]).isdisjoint(second["messages"])
    actions.continue_trace(root, "try another way", point)
    after = trace_dag(store, root)
    second = after["goals"][1]
    assert second["rewound"] and second["greyed"], "its messages are all off the main path"
    assert not after["goals"][0]["rewound"]
    (off,) = [b for b in after["branches"] if not b["main"]]
    assert off["fork_sequence"] == point and set(second["messages"]) <= set(off["messages"])
    shown = {n["sequence"]: n for n in after["messages"]}
    assert all(not shown[s]["main"] for s in off["messages"])


@pytest.fixture
def redis_store(redis_url: str) -> Iterator[RedisStore]:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    with RedisStore.from_url(redis_url) as page_store:
        yield page_store


@pytest.mark.integration
def test_the_dag_route_answers_and_refuses_bad_ids(redis_store: RedisStore, tmp_path: Path) -> None:
    actions, root, _ = planned(redis_store, tmp_path)
    with serving(page_config(actions)) as url, httpx.Client(base_url=url, timeout=10) as http:
        answer = http.get(f"/api/traces/{root}/dag")
        assert answer.status_code == 200 and len(answer.json()["goals"]) == 2
        assert http.get("/api/traces/nope-1/dag").status_code == 404
        assert http.get("/api/traces/..%2Fetc/dag").status_code in (400, 404)


@pytest.mark.integration
def test_the_plan_view_shows_goals_their_messages_and_a_rewound_branch(
    redis_store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    actions, root, point = planned(redis_store, tmp_path)
    actions.continue_trace(root, "try another way", point)
    wait = waiter(browser)
    with serving(page_config(actions)) as url:
        browser.get(f"{url}/?trace={root}")
        wait.until(lambda b: b.find_element(By.ID, "plan").get_attribute("data-goals") == "2")
        found = wait.until(lambda b: plan_shown(b) if plan_shown(b)["goals"] else None)
        assert found is not None
        shown: dict[str, Any] = found
        assert [g["id"] for g in shown["goals"]] == ["1", "2"]
        first, second = shown["goals"]
        assert "survey the code" in first["text"] and "done" in first["text"]
        assert first["messages"] > 0, "goal 1's messages"
        assert redis_store.children(root)[0] in first["text"], "its sub-agent"
        assert second["greyed"] and "rewound" in second["text"]
        assert "rewrite it in <b>rust</b>" in second["text"], "text stays text"
        assert shown["bold"] == 0, "no markup from the model's text"
        assert shown["fork"] == str(point), "the rewound branch and where it forked"
        browser.execute_script(f"document.querySelector(`{GOAL_ONE} > summary`).click()")
        wait.until(lambda b: b.execute_script(f"return !document.querySelector(`{GOAL_ONE}`).open"))
        screenshot(browser, "serve-plan")
        assert script_errors(browser) == []


GOAL_ONE = "#plan details.goal[data-goal='1']"
PLAN_SHOWN = """
const goals = [...document.querySelectorAll('#plan details.goal[data-goal]')].map((g) => ({
  id: g.dataset.goal, text: g.textContent, greyed: g.classList.contains('greyed'),
  messages: g.querySelectorAll('.plan-message').length}));
const fork = document.querySelector('#plan .branch-rewound');
return {goals, bold: document.querySelectorAll('#plan b').length,
        fork: fork ? fork.dataset.fork : null};
"""


def plan_shown(browser: webdriver.Chrome) -> dict[str, Any]:
    """The Plan view as one snapshot (a live redraw cannot leave a stale element behind)."""
    shown: dict[str, Any] = browser.execute_script(PLAN_SHOWN)
    return shown
