"""The live page in a real headless Chromium, over `fleet serve` and a real worker.

Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them); skipped without
them unless `CI` is set, where their absence fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from tests.fleetkit import client, explore_script, fleet_settings
from tests.procs import start_worker, wait_for_workers
from tests.servekit import serve_process

pytestmark = pytest.mark.integration

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
HOSTILE = "<img src=x onerror=\"document.title='pwned'\">"
BRANCHES = 3


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing (and CI is set)")
        pytest.skip("needs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(flag)
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def statuses(browser: webdriver.Chrome) -> dict[str, str]:
    nodes = browser.find_elements(By.CSS_SELECTOR, ".node")
    return {
        str(n.get_attribute("data-trace-id")): n.find_element(By.CSS_SELECTOR, ".status").text
        for n in nodes
    }


def test_the_page_grows_the_tree_live_and_shows_messages(
    redis_url: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    settings = fleet_settings(redis_url, tmp_path)
    model = explore_script(tmp_path / "model.yaml", BRANCHES, latency_ms=50, branch_turns=2)
    fleet = client(settings)
    handle = fleet.submit(f"survey {HOSTILE}", model=model)
    root = handle.trace_id
    with serve_process(redis_url) as url:
        browser.get(f"{url}/?trace={root}")
        wait = WebDriverWait(browser, 30, poll_frequency=0.1)
        wait.until(lambda b: statuses(b).get(root) == "queued")
        browser.execute_script("window.sameDocument = true;")
        assert len(statuses(browser)) == 1  # no branch yet: no worker runs
        with start_worker(
            redis_url, concurrency=8, env_extra={"FLEET_WORKSPACE": str(tmp_path)}
        ) as w:
            wait_for_workers(redis_url, [w.name], timeout_s=30)
            wait.until(lambda b: len(statuses(b)) == 1 + BRANCHES)
            wait.until(lambda b: set(statuses(b).values()) == {"completed"})
        assert browser.execute_script("return window.sameDocument === true") is True  # no reload
        shown = statuses(browser)
        branches = sorted(t for t in shown if t != root)
        assert branches == sorted(fleet.store.children(root))
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
        first = browser.find_element(
            By.CSS_SELECTOR, f'.node[data-trace-id="{branches[0]}"] .node-head'
        )
        first.click()
        wait = WebDriverWait(browser, 10, poll_frequency=0.1)
        wait.until(lambda b: "done: Branch 1" in b.find_element(By.ID, "message-list").text)
