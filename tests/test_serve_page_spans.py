"""The trace page beside LangSmith / Langfuse / Phoenix, in a real headless Chromium.

Model and tool calls as timed spans (their durations, tokens, cost, attempt numbers) in the
timeline and the conversation; a retried call's attempts; the answer's Markdown rendered
from a parsed tree with hostile Markdown inert; children in spawn order; tasks cut at a
word; "Stop tree" only while the tree runs; money formatted and an "unpriced" mark; the
front page's error column and "completed with N failed children".

The retried call is real: an OpenAI-wire client against a local fake provider that answers
500 first (tests/test_llm_openai.py's), on the page's Redis store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

import fleet.llm.base
from fleet.conversation.roots import TaskSpec, create_root
from fleet.errors import ModelBehaviorError
from fleet.inprocess import InProcessDispatcher
from fleet.limits.budget import Budget
from fleet.llm.base import LLMClient, LLMResponse
from fleet.llm.openai import OpenAIClient
from fleet.llm.retry import RetryPolicy
from fleet.loop.runner import Runner, run_to_end
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, call, text
from tests.browserkit import screenshot, script_errors
from tests.servekit import LocalActions, page_config, serving
from tests.test_llm_openai import FakeProvider, Reply, completion

pytestmark = pytest.mark.integration

ANSWER = "\n".join(
    [
        "# Findings",
        "",
        "The **shed** is *fine*; run `make test` first.",
        "",
        "```python",
        "print('<b>not bold</b>')",
        "```",
        "",
        "- one",
        "- two",
        "",
        "[the docs](https://example.com/docs) [bad](javascript:window.pwned=1)",
        '<img src=x onerror="window.pwned=1"> <script>window.pwned=1</script>',
        "[data](data:text/html,<script>window.pwned=1</script>) <b onclick=x>raw</b>",
    ]
)


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisStore]:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    with RedisStore.from_url(redis_url) as page_store:
        yield page_store


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProvider]:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)
    fake = FakeProvider()
    yield fake
    fake.stop()


def actions_with(store: RedisStore, tmp_path: Path, model: LLMClient) -> LocalActions:
    settings = Settings(workspace=tmp_path, allow_scripted=True, env={})
    return LocalActions(Runtime.build(settings, store, InProcessDispatcher(), clients={"m": model}))


def waiter(browser: webdriver.Chrome) -> WebDriverWait[webdriver.Chrome]:
    return WebDriverWait(
        browser, 30, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    )


def text_of(browser: webdriver.Chrome, element_id: str) -> str:
    return str(
        browser.execute_script(f"return document.getElementById('{element_id}').textContent")
    )


def js(browser: webdriver.Chrome, script: str) -> Any:
    return browser.execute_script(script)


def test_a_retried_call_its_spans_and_its_markdown_answer(
    store: RedisStore, provider: FakeProvider, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    (tmp_path / "notes.md").write_text("the shed is fine\n")
    read = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "notes.md"}'},
            }
        ],
    }
    provider.replies.extend(
        [
            Reply(500, {"error": {"message": "upstream hiccup"}}),
            Reply(200, completion(read, "tool_calls", prompt_tokens=1200, completion_tokens=30)),
            Reply(200, completion({"role": "assistant", "content": ANSWER}, prompt_tokens=1300)),
        ]
    )
    # A model the price table does not know: its tokens cost "unpriced", not $0.0000.
    model = OpenAIClient(
        f"{provider.url}/v1", "sk-test", "local-model", retry=RetryPolicy(sleep=lambda _s: None)
    )
    local = actions_with(store, tmp_path, model)
    spec = TaskSpec("check the shed", "m", budget=Budget(usd=1.0))
    root = create_root(local.runtime, spec).trace_id
    run_to_end(Runner(local.runtime), root)
    assert store.get_trace(root).status == "completed"
    wait = waiter(browser)
    with serving(page_config(local)) as url:
        browser.get(f"{url}/?trace={root}")
        wait.until(lambda b: "answer" in text_of(b, "trace-output"))
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".attempts li"))

        # The conversation: the model call as a span, its two attempts, the tool call's span.
        spans = js(
            browser,
            "return Array.from(document.querySelectorAll('#message-list .call-span[data-kind]'),"
            " s => [s.dataset.kind, Number(s.dataset.durationMs), s.textContent])",
        )
        kinds = [kind for kind, _, _ in spans]
        assert kinds == ["model", "tool", "model"], spans
        assert all(ms >= 0 for _, ms, _ in spans)
        first = spans[0][2]
        assert "model call" in first and " → " in first and "attempt 2 of 2" in first
        assert "1,200+30 tokens" in first and "unpriced" in first and "$0.0000" not in first
        attempts = js(
            browser,
            "return Array.from(document.querySelectorAll('.attempts li'),"
            " li => [li.className, li.textContent])",
        )
        assert len(attempts) == 2
        assert attempts[0][0] == "attempt failed" and "HTTP 500" in attempts[0][1]
        assert "upstream hiccup" in attempts[0][1] and attempts[1][1].endswith("answered")

        # The answer's Markdown: built as elements, the hostile parts inert text.
        md = "#trace-output .md"
        found = js(
            browser,
            f"const md = document.querySelector('{md}'); return {{"
            " h: md.querySelector('h3').textContent,"
            " strong: md.querySelector('strong').textContent,"
            " em: md.querySelector('em').textContent, code: md.querySelector('p code').textContent,"
            " fence: md.querySelector('pre code').textContent,"
            " items: Array.from(md.querySelectorAll('ul li'), li => li.textContent),"
            " links: Array.from(md.querySelectorAll('a'), a => a.getAttribute('href')),"
            " text: md.textContent}",
        )
        assert (found["h"], found["strong"], found["em"]) == ("Findings", "shed", "fine")
        assert found["code"] == "make test" and found["fence"] == "print('<b>not bold</b>')"
        assert found["items"] == ["one", "two"]
        assert found["links"] == ["https://example.com/docs"]  # never javascript: or data:
        for inert in ("[bad](javascript:window.pwned=1)", '<img src=x onerror="window.pwned=1">'):
            assert inert in found["text"]
        assert "<script>window.pwned=1</script>" in found["text"]
        assert "<b onclick=x>raw</b>" in found["text"]
        assert (
            browser.find_elements(By.CSS_SELECTOR, "#messages img, #messages b, #messages script")
            == []
        )
        assert js(browser, "return window.pwned") is None

        # The tree: money, the unpriced mark, the USD budget, no "Stop tree" on a finished tree.
        assert "used $0.00" in text_of(browser, "tree-budget")
        assert "unpriced" in text_of(browser, "tree-totals")
        assert js(browser, "return document.getElementById('stop').hidden") is True

        # The timeline: the calls as spans with their durations; the retried one says so.
        browser.find_element(By.ID, "tab-timeline").click()
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".tl-call"))
        calls = js(
            browser,
            "return Array.from(document.querySelectorAll('.tl-call'),"
            " c => [c.dataset.kind, Number(c.dataset.durationMs), c.title,"
            " c.getBoundingClientRect().width])",
        )
        assert [kind for kind, _, _, _ in calls] == ["model", "tool", "model"]
        assert all(ms >= 0 and width > 0 for _, ms, _, width in calls)
        assert "attempt 2 of 2" in calls[0][2] and "1,200+30 tokens · unpriced" in calls[0][2]
        assert calls[1][2].startswith("tool read_file ")
        screenshot(browser, "serve-spans")
        assert script_errors(browser) == []


LONG_TASK = " ".join(["Survey"] + ["the garden shed and its contents carefully"] * 12)


def spawner(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> LLMResponse:
    """The root explores two branches (the second fails), then delegates, then answers."""
    task = next(str(m["content"]) for m in messages if m["role"] == "user")
    turns = sum(m["role"] == "assistant" for m in messages)
    if task.startswith(("branch broken", "fail at once")):
        raise ModelBehaviorError("the branch's model answered nonsense")
    if task.startswith(("branch", "zz delegate")):
        return text(f"done: {task}")
    if turns == 0:
        return call("agent", task=["branch one", "branch broken"])
    if turns == 1:
        return call("agent", task="zz delegate later")
    return text("**all** done")


def test_spawn_order_cut_tasks_failed_children_and_the_error_column(
    store: RedisStore, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    local = actions_with(store, tmp_path, ScriptedModel(function=spawner))
    root = create_root(local.runtime, TaskSpec(LONG_TASK, "m")).trace_id
    run_to_end(Runner(local.runtime), root)
    assert store.get_trace(root).status == "completed"
    spawned = sorted(store.get_traces(store.children(root)), key=lambda t: t.created_at_ms)
    ids = [t.trace_id for t in spawned]
    assert "@explore-" in ids[0] and "@delegate-" in ids[-1]
    assert sorted(ids) != ids, "alphabetical order (delegate < explore) is not spawn order"
    failed = local.run("fail at once", model="m")
    assert failed.status == "failed" and failed.error
    wait = waiter(browser)
    with serving(page_config(local)) as url:
        browser.get(f"{url}/?trace={root}")
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".node")) == 4)
        wait.until(lambda b: "with 1 failed child" in text_of(b, "tree-totals"))
        shown = js(
            browser,
            "return Array.from(document.querySelectorAll('#tree-root > .node > .children > .node'),"
            " n => n.dataset.traceId)",
        )
        assert shown == ids
        # A shorter text may come first (seen in CI: 200 characters, no ellipsis), then the
        # trace's own task cut at a word
        first_task = "return document.querySelector('.node-task').textContent"
        wait.until(lambda b: str(js(b, first_task)).endswith("…"))
        task = js(browser, first_task)
        assert task.endswith("…") and len(task) <= 301
        assert LONG_TASK.startswith(task[:-1]) and LONG_TASK[len(task) - 1] == " "  # at a word
        browser.find_element(By.ID, "tab-timeline").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".tl-row")) == 4)
        rows = js(browser, "return window.fleetPage.timeline.order")
        assert rows == [root, *ids]

        browser.get(f"{url}/")
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#trace-rows tr")) == 2)
        cells = js(
            browser,
            "return Array.from(document.querySelectorAll('#trace-rows tr'), tr =>"
            " [tr.dataset.traceId, tr.querySelector('.status').textContent,"
            " tr.querySelector('[data-col=error]').textContent])",
        )
        by_id = {trace_id: (status, error) for trace_id, status, error in cells}
        assert by_id[root] == ("completed with 1 failed child", "")
        assert by_id[failed.trace_id][0] == "failed"
        assert by_id[failed.trace_id][1] and by_id[failed.trace_id][1] in failed.error
        assert [h.text for h in browser.find_elements(By.CSS_SELECTOR, "thead th")][3] == "error"
        screenshot(browser, "serve-front-errors")
        assert script_errors(browser) == []
