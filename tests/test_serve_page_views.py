"""The page's views in a real headless Chromium: conversation, timeline, budget, front page,
actions, hostile text, and the render time of wide trees.

The service runs in a thread over a real Redis; actions run the trace on in this process
(`LocalActions`). The live page over a real worker is tests/test_serve_page.py.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.wait import WebDriverWait

from fleet.config.approval_rules import ApprovalRule
from fleet.conversation import approval
from fleet.conversation.roots import TaskSpec, create_root
from fleet.inprocess import InProcessDispatcher
from fleet.limits.budget import Budget
from fleet.limits.capability import budget_state
from fleet.llm.base import LLMResponse
from fleet.loop.runner import Runner, run_to_end
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, call, text
from tests.browserkit import screenshot, script_errors
from tests.fleetkit import explore_script, wait_until
from tests.servekit import LocalActions, page_config, serving

pytestmark = pytest.mark.integration

PWN = "window.pwned=1"
HOSTILE_TEXTS = (
    f"<script>{PWN}</script>",
    f'<img src=x onerror="{PWN}">',
    "[click me](javascript:window.pwned=1)",
    '<a href="javascript:window.pwned=1">link</a>',
    "\x1b[31mred\x1b[0m\x1b]0;title\x07",
)
HOSTILE = " ".join(HOSTILE_TEXTS)


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisStore]:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    with RedisStore.from_url(redis_url) as page_store:
        yield page_store


def actions_with(store: RedisStore, tmp_path: Path, model: ScriptedModel) -> LocalActions:
    settings = Settings(workspace=tmp_path, allow_scripted=True, env={})
    return LocalActions(Runtime.build(settings, store, InProcessDispatcher(), clients={"m": model}))


def waiter(browser: webdriver.Chrome) -> WebDriverWait[webdriver.Chrome]:
    """Waits that look again when the page re-rendered what they held (a live page does)."""
    return WebDriverWait(
        browser, 30, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    )


def clicked(browser: webdriver.Chrome, selector: str) -> bool:
    """Click what `selector` finds (a wait looks again if a re-render made it stale)."""
    browser.find_element(By.CSS_SELECTOR, selector).click()
    return True


def text_of(browser: webdriver.Chrome, element_id: str) -> str:
    script = f"return document.getElementById('{element_id}').textContent"
    return str(browser.execute_script(script))


def segment_kinds(browser: webdriver.Chrome, trace_id: str) -> set[str]:
    found = browser.execute_script(
        "const row = document.querySelector(`.tl-row[data-trace-id='${arguments[0]}']`);"
        "return row ? Array.from(row.querySelectorAll('.tl-seg'), s => s.dataset.kind) : [];",
        trace_id,
    )
    return set(found)


def test_conversation_timeline_and_budget_of_an_explore(
    store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    local = actions_with(store, tmp_path, ScriptedModel())
    model = explore_script(tmp_path / "model.yaml", 3, branch_turns=1)
    spec = TaskSpec("survey the shed", model, budget=Budget(tokens=50_000))
    root = create_root(local.runtime, spec).trace_id
    run_to_end(Runner(local.runtime), root)
    children = store.children(root)
    state = budget_state(store, root)
    assert state is not None and state.used_tokens > 0
    wait = waiter(browser)
    with serving(page_config(local)) as url:
        browser.get(f"{url}/?trace={root}")
        expected = f"tokens: used {state.used_tokens:,} · reserved {state.reserved_tokens:,}"
        wait.until(lambda b: expected + " · limit 50,000" in text_of(b, "tree-budget"))
        assert "4 traces" in text_of(browser, "tree-totals")
        assert f"models answered: {model}" in text_of(browser, "tree-models")
        browser.find_element(By.ID, "tab-timeline").click()
        both = {"queued", "running"}  # every branch: queued (announced), then running
        wait.until(lambda b: all(both <= segment_kinds(b, c) for c in children))
        assert {"running", "children"} <= segment_kinds(browser, root)
        screenshot(browser, "serve-timeline")
        label = f".tl-row[data-trace-id='{children[0]}'] .tl-label"
        wait.until(lambda b: clicked(b, label))
        wait.until(lambda b: text_of(b, "messages-title") == children[0])
        wait.until(lambda b: "done: Branch 1" in text_of(b, "message-list"))
        shown = browser.execute_script(CONVERSATION)
        assert shown["call"] == "→ list_dir"
        assert '"path": "."' in shown["arguments"]
        assert "model.yaml" in shown["result"]
        assert shown["system_open"] is False  # the system prompt starts collapsed
        browser.find_element(By.ID, "tab-tree").click()
        screenshot(browser, "serve-conversation")
        check_the_keyboard(browser, children)
        assert script_errors(browser) == []


def check_the_keyboard(browser: webdriver.Chrome, children: list[str]) -> None:
    """j moves to the next trace, Enter opens it, t shows the timeline, focus shows times."""
    wait = waiter(browser)
    browser.execute_script("document.querySelector('.node-head').focus()")
    keys = ActionChains(browser)
    keys.send_keys("j").send_keys(Keys.ENTER).perform()
    wait.until(lambda b: text_of(b, "messages-title") == children[0])
    ActionChains(browser).send_keys("t").perform()
    wait.until(lambda b: b.find_element(By.ID, "timeline").is_displayed())
    label = f".tl-row[data-trace-id='{children[1]}'] .tl-label"
    browser.execute_script(f"document.querySelector(`{label}`).focus()")
    wait.until(lambda b: text_of(b, "timeline-hover").startswith("explore-002: queued "))
    assert "running " in text_of(browser, "timeline-hover")
    ActionChains(browser).send_keys(Keys.ESCAPE).perform()
    wait.until(lambda b: not b.find_element(By.ID, "messages").is_displayed())


CONVERSATION = """
const list = document.getElementById("message-list");
const call = list.querySelector(".tool-call");
return {
  call: call.querySelector(".call-name").textContent,
  arguments: call.querySelector("pre.arguments").textContent,
  result: call.querySelector(".tool-result").textContent,
  system_open: list.querySelector("details.collapsed").open,
};
"""


def hostile_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    if not any(m["role"] == "tool" for m in messages):
        return call("write_file", path="x.txt", content=HOSTILE)
    return text(f"done {HOSTILE}")


def test_hostile_model_text_renders_as_text(
    store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    local = actions_with(store, tmp_path, ScriptedModel(function=hostile_model))
    trace = local.run(f"task {HOSTILE}", model="m")
    assert trace.status == "completed", trace.error
    with serving(page_config(local)) as url:
        browser.get(f"{url}/?trace={trace.trace_id}&open={trace.trace_id}")
        waiter(browser).until(lambda b: "done <script>" in text_of(b, "message-list"))
        shown = text_of(browser, "message-list")
        for hostile in HOSTILE_TEXTS:  # every one as its own characters
            assert hostile in shown or json.dumps(hostile)[1:-1] in shown, hostile
        assert "\x1b[31mred" in shown
        browser.get(f"{url}/?q=task")
        waiter(browser).until(lambda b: "task <script>" in text_of(b, "trace-rows"))
        assert browser.execute_script("return window.pwned") is None
        assert browser.find_elements(By.CSS_SELECTOR, "img") == []
        scripts = browser.find_elements(By.CSS_SELECTOR, "script")
        assert [s.get_attribute("src") for s in scripts] == [f"{url}/static/app.js"]
        links = browser.find_elements(By.CSS_SELECTOR, "a")
        assert all(str(a.get_attribute("href")).startswith(url) for a in links)
        assert script_errors(browser) == []


def asker(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    if not any(m["role"] == "tool" for m in messages):
        return call("ask_human", question="Which colour?")
    return text(f"painted it {messages[-1]['content']}")


def test_the_front_page_filters_to_waiting_and_a_reply_and_a_stop_reach_the_tree(
    store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    local = actions_with(store, tmp_path, ScriptedModel(function=asker))
    asked = local.run("paint the shed", model="m")
    assert asked.status == "waiting"
    idle = create_root(local.runtime, TaskSpec("never runs", "m")).trace_id  # queued
    wait = waiter(browser)
    with serving(page_config(local)) as url:
        browser.get(f"{url}/")
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#trace-rows tr")) == 2)
        screenshot(browser, "serve-front")
        Select(browser.find_element(By.ID, "filter-waiting")).select_by_value("person")
        browser.find_element(By.CSS_SELECTOR, "#filters button[type=submit]").click()
        wait.until(lambda b: rows(b) == [asked.trace_id])
        assert "waiting on person" in text_of(browser, "trace-rows")
        wait.until(lambda b: clicked(b, "#trace-rows a"))
        wait.until(lambda b: b.find_elements(By.ID, "reply-input"))
        assert "asks: Which colour?" in text_of(browser, "reply-form")
        browser.find_element(By.ID, "reply-input").send_keys("green")
        browser.find_element(By.CSS_SELECTOR, "#reply-form button").click()
        wait_until(lambda: store.get_trace(asked.trace_id).status == "completed", 30, "reply")
        assert store.get_trace(asked.trace_id).answer == "painted it green"
        wait.until(lambda b: not b.find_elements(By.ID, "reply-input"))  # answered: gone
        browser.get(f"{url}/?trace={idle}")
        wait.until(lambda b: text_of(b, "tree-totals").startswith("tree: queued"))
        browser.find_element(By.ID, "stop").click()
        wait_until(lambda: store.get_trace(idle).status == "stopped", 30, "the stop")
        assert script_errors(browser) == []


def writer(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        return call("write_file", call_id="w1", path="out.txt", content=f"written {HOSTILE}")
    return text(f"tool said: {results[-1]['content']}")


def test_approve_from_the_page_and_a_rewound_conversation_offers_its_branches(
    store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    local = actions_with(store, tmp_path, ScriptedModel(function=writer))
    default = replace(local.runtime.presets["default"], approve=(ApprovalRule("write_file"),))
    local = LocalActions(
        replace(local.runtime, presets={**local.runtime.presets, "default": default})
    )
    trace = local.run("write it", model="m").trace_id
    wait = waiter(browser)
    with serving(page_config(local)) as url:
        browser.get(f"{url}/?trace={trace}")
        wait.until(lambda b: b.find_elements(By.ID, "approval-form"))
        shown = text_of(browser, "approval-form")
        assert "wants to run write_file" in shown and "out.txt" in shown
        digest = str((approval.pending(store.get_trace(trace)) or {})["digest"])
        assert f"digest {digest}" in shown and 'path: "out.txt"' in shown  # the call as shown
        browser.find_element(By.CSS_SELECTOR, "#approval-form button").click()  # Approve
        wait_until(lambda: store.get_trace(trace).status == "completed", 30, "the approval")
        assert (tmp_path / "out.txt").read_text() == f"written {HOSTILE}"
        wait.until(lambda b: b.find_elements(By.ID, "continue-form"))
        first_user = next(m for m in store.messages(trace) if m.role == "user").sequence
        browser.find_element(By.ID, "continue-input").send_keys("write it again")
        browser.find_element(By.ID, "continue-after").send_keys(str(first_user - 1))
        browser.find_element(By.CSS_SELECTOR, "#continue-form button").click()
        wait_until(lambda: store.get_trace(trace).status in ("completed", "waiting"), 30, "it")
        wait_until(lambda: len(store.messages(trace)) > 6, 30, "the rewound turn")
        browser.get(f"{url}/?trace={trace}")
        wait.until(lambda b: b.find_elements(By.ID, "branch-select"))
        select = Select(browser.find_element(By.ID, "branch-select"))
        assert len(select.options) == 2
        assert select.first_selected_option.text.startswith("main")
        assert "write it again" in text_of(browser, "message-list")
        rewound = next(o for o in select.options if o.text.startswith("rewound"))
        select.select_by_value(str(rewound.get_attribute("value")))
        wait.until(lambda b: "write it again" not in text_of(b, "message-list"))
        assert "write it" in text_of(browser, "message-list")
        assert script_errors(browser) == []


def rows(browser: webdriver.Chrome) -> list[str]:
    found = browser.find_elements(By.CSS_SELECTOR, "#trace-rows tr")
    return [str(r.get_attribute("data-trace-id")) for r in found]


def test_an_action_from_another_origin_or_without_the_token_is_refused(
    store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    local = actions_with(store, tmp_path, ScriptedModel(function=asker))
    asked = local.run("paint the shed", model="m").trace_id
    with serving(page_config(local)) as target, attacker(tmp_path) as evil:
        reply = f"{target}/api/traces/{asked}/reply"
        browser.get(f"{target}/")  # same origin, but no CSRF token: 403
        assert browser.execute_async_script(FETCH, reply, {}, "cors") == 403
        forged = {"X-Fleet-CSRF": "guessed-" + "x" * 30}
        assert browser.execute_async_script(FETCH, reply, forged, "cors") == 403
        browser.get(f"{evil}/attack.html")  # another origin, no CSP of ours in the way
        # A custom header needs a preflight, which the service never grants.
        assert browser.execute_async_script(FETCH, reply, forged, "cors") == "refused"
        # A "simple" cross-site POST is sent, and refused by Origin and by the missing token.
        assert browser.execute_async_script(FETCH, reply, {}, "no-cors") == 0  # opaque
        session = browser.execute_async_script(FETCH_GET, f"{target}/api/session")
        assert session == "refused", "another origin cannot read the CSRF token"
    assert store.get_trace(asked).status == "waiting", "nothing was answered"


@contextlib.contextmanager
def attacker(folder: Path) -> Iterator[str]:
    """A plain web server on another port (another origin) serving an empty page."""
    site = folder / "site"
    site.mkdir()
    (site / "attack.html").write_text("<!doctype html><title>elsewhere</title>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


FETCH = """
const [url, headers, mode, done] = arguments;
const body = mode === "no-cors" ? "answer=green" : JSON.stringify({answer: "green"});
fetch(url, {method: "POST", mode, headers, body}).then(r => done(r.status), () => done("refused"));
"""
FETCH_GET = """
const [url, done] = arguments;
fetch(url).then(r => r.json()).then(b => done(b.csrf), () => done("refused"));
"""


def test_a_message_from_the_page_reaches_the_agent_and_shows_with_its_sender(
    store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    from fleet.conversation.messages import CHECK_MESSAGES, inbox

    def reader(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
        tools_done = [m for m in messages if m["role"] == "tool"]
        if not tools_done:
            return call("ask_human", question="Which colour?")
        if len(tools_done) == 1:
            return call(CHECK_MESSAGES)
        return text("read it")

    local = actions_with(store, tmp_path, ScriptedModel(function=reader))
    asked = local.run("paint the shed", model="m")
    wait = waiter(browser)
    with serving(page_config(local)) as url:
        browser.get(f"{url}/?trace={asked.trace_id}")
        wait.until(lambda b: b.find_elements(By.ID, "message-input"))
        browser.find_element(By.ID, "message-input").send_keys(f"use green {HOSTILE}")
        browser.find_element(By.CSS_SELECTOR, "#message-form button").click()
        wait_until(lambda: inbox(local.runtime).count(asked.trace_id) == 1, 30, "the message")
        [entry] = inbox(local.runtime).after(asked.trace_id, None, 10)
        assert entry.posted.sender == "page" and not entry.posted.interrupt
        browser.find_element(By.ID, "reply-input").send_keys("green")
        browser.find_element(By.CSS_SELECTOR, "#reply-form button").click()
        wait_until(lambda: store.get_trace(asked.trace_id).status == "completed", 30, "the run")
        wait.until(lambda b: "injected: messages" in text_of(b, "message-list"))
        wait.until(lambda b: "from page: use green" in text_of(b, "message-list"))
        assert browser.execute_script("return window.pwned === undefined")
        assert script_errors(browser) == []
