"""The live page in a real headless Chromium, over `fleet serve` and a real worker.

Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them); skipped without
them unless `CI` is set, where their absence fails (tests/browserkit.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import yaml
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from fleet.client import Fleet
from tests.browserkit import page_value, script_errors
from tests.fleetkit import client, explore_script, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers
from tests.servekit import free_port, serve_process

pytestmark = pytest.mark.integration

HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
BRANCHES = 3


def statuses(browser: webdriver.Chrome) -> dict[str, str]:
    nodes = browser.find_elements(By.CSS_SELECTOR, ".node")
    return {
        str(n.get_attribute("data-trace-id")): str(
            n.find_element(By.CSS_SELECTOR, ".status").get_attribute("textContent")
        )
        for n in nodes
    }


def test_the_page_grows_the_tree_live_resumes_its_stream_and_shows_messages(
    redis_url: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    settings = fleet_settings(redis_url, tmp_path)
    model = explore_script(tmp_path / "model.yaml", BRANCHES, latency_ms=50, branch_turns=2)
    fleet = client(settings)
    root = fleet.submit(f"survey {HOSTILE}", model=model).trace_id
    wait = WebDriverWait(browser, 30, poll_frequency=0.1)
    port = free_port()
    with serve_process(redis_url, port=port) as url:
        browser.get(f"{url}/?trace={root}")
        wait.until(lambda b: statuses(b).get(root) == "queued")
        browser.execute_script("window.sameDocument = true;")
        assert len(statuses(browser)) == 1  # no branch yet: no worker runs
        browser.find_element(By.ID, "tab-timeline").click()
        wait.until(lambda b: segments(b, root) == [("queued", "now")])  # open, still growing
    # The service is gone: the page's event stream dropped. The tree runs on meanwhile.
    worker_env = {"FLEET_WORKSPACE": str(tmp_path)}
    with start_worker(redis_url, concurrency=8, env_extra=worker_env) as worker:
        wait_for_workers(redis_url, [worker.name], timeout_s=30)
        wait_until(lambda: len(fleet.store.children(root)) == BRANCHES, 30, "the branches")
        with serve_process(redis_url, port=port) as url:  # back: the page reconnects
            wait.until(lambda b: len(statuses(b)) == 1 + BRANCHES)
            wait.until(lambda b: set(statuses(b).values()) == {"completed"})
            stream = fleet.store.read_events(root, count=10_000)
            # Every event once: nothing lost while disconnected, nothing shown twice.
            wait.until(lambda b: page_value(b, "events") == len(stream))
            assert page_value(browser, "lastEventId") == stream[-1][0]
            assert page_value(browser, "reconnects") >= 1
            assert browser.execute_script("return window.sameDocument === true") is True
            children = fleet.store.children(root)
            for child in children:  # grown live: each branch queued, then running, then ended
                assert [kind for kind, _ in segments(browser, child)] == ["queued", "running"]
            assert page_value(browser, "timeline.draws") > 2
            browser.find_element(By.ID, "tab-tree").click()
            check_the_tree(browser, fleet, root)
            first = browser.find_elements(By.CSS_SELECTOR, ".node .children .node-head")[0]
            first.click()
            wait.until(lambda b: b.find_element(By.ID, "messages-title").text == children[0])
            wait.until(lambda b: "done: Branch 1" in b.find_element(By.ID, "message-list").text)
            assert script_errors(browser) == []


def segments(browser: webdriver.Chrome, trace_id: str) -> list[tuple[str, str]]:
    """The timeline row's segments: (kind, "now" while open else "ended")."""
    found = browser.execute_script(
        "const row = document.querySelector(`.tl-row[data-trace-id='${arguments[0]}']`);"
        "return row ? Array.from(row.querySelectorAll('.tl-seg'),"
        " s => [s.dataset.kind, s.dataset.hover.includes('→ now)') ? 'now' : 'ended']) : [];",
        trace_id,
    )
    return [(str(kind), str(state)) for kind, state in found]


def check_the_tree(browser: webdriver.Chrome, fleet: Fleet, root: str) -> None:
    """Order, escaping, facts and collaborators of the finished tree as shown."""
    shown = [
        n.get_attribute("data-trace-id") for n in browser.find_elements(By.CSS_SELECTOR, ".node")
    ]
    assert shown == [root, *sorted(fleet.store.children(root))]
    root_node = browser.find_element(By.CSS_SELECTOR, f'.node[data-trace-id="{root}"]')
    task = root_node.find_element(By.CSS_SELECTOR, ".node-task").text
    assert task.endswith(HOSTILE)  # shown as text, not markup
    assert browser.find_elements(By.CSS_SELECTOR, "img") == []
    assert browser.title != "pwned"
    facts = root_node.find_element(By.CSS_SELECTOR, ".node-facts").text
    stats = fleet.trace(root).stats
    assert f"{stats.prompt_tokens + stats.completion_tokens} tokens" in facts
    assert "last tool agent" in facts and "iteration 2" in facts
    collaborators = root_node.find_elements(By.CSS_SELECTOR, ".collaborators li")
    assert [c.text.split(":")[0] for c in collaborators] == [
        f"explore-{i:03d} [agent, completed]" for i in range(1, BRANCHES + 1)
    ]


def test_a_reply_and_a_stop_from_the_page_reach_a_tree_on_real_workers(
    redis_url: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    """Through `fleet serve` (its `Fleet` client enqueues) and a Celery worker."""
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    fleet = client(fleet_settings(redis_url, tmp_path))
    steps = [
        {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which colour?"}}]},
        {"content": "painted it {last_tool}"},
    ]
    asker = tmp_path / "ask.yaml"
    asker.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
    slow = explore_script(tmp_path / "slow.yaml", 2, latency_ms=1500, branch_turns=20)
    wait = WebDriverWait(browser, 60, poll_frequency=0.1)
    worker_env = {"FLEET_WORKSPACE": str(tmp_path)}
    with start_worker(redis_url, concurrency=4, env_extra=worker_env) as worker:
        wait_for_workers(redis_url, [worker.name], timeout_s=30)
        asked = fleet.submit("paint the shed", model=f"scripted:{asker}").trace_id
        wait_until(lambda: fleet.trace(asked).status == "waiting", 30, "the question")
        busy = fleet.submit("survey slowly", model=slow).trace_id
        with serve_process(redis_url) as url:
            browser.get(f"{url}/?trace={asked}")
            wait.until(lambda b: b.find_elements(By.ID, "reply-input"))
            browser.find_element(By.ID, "reply-input").send_keys("green")
            browser.find_element(By.CSS_SELECTOR, "#reply-form button").click()
            wait_until(lambda: fleet.trace(asked).status == "completed", 30, "the reply")
            assert fleet.trace(asked).answer == "painted it green"
            wait_until(lambda: len(fleet.store.children(busy)) == 2, 30, "the branches")
            browser.get(f"{url}/?trace={busy}")
            wait.until(lambda b: len(statuses(b)) == 3)
            browser.find_element(By.ID, "stop").click()
            tree = [busy, *fleet.store.children(busy)]
            try:
                wait_until(lambda: {fleet.trace(t).status for t in tree} == {"stopped"}, 60, "")
            except AssertionError:
                shown = {t: (fleet.trace(t).status, fleet.trace(t).error) for t in tree}
                raise AssertionError(
                    f"not stopped: {shown}; page: {script_errors(browser)}"
                ) from None
            wait.until(lambda b: set(statuses(b).values()) == {"stopped"})
            assert script_errors(browser) == []
