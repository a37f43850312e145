"""The serve page shows a task's image as a placeholder with its size, never its bytes."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import redis
import yaml
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from tests import imagekit
from tests.fleetkit import client, fleet_settings
from tests.procs import start_worker, wait_for_workers
from tests.servekit import free_port, serve_process
from tests.test_serve_page import statuses

pytestmark = pytest.mark.integration


def test_the_page_shows_an_image_placeholder_with_its_size(
    redis_url: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    shot = imagekit.png(8, 8)
    (tmp_path / "shot.png").write_bytes(shot)
    script = tmp_path / "model.yaml"
    script.write_text(yaml.safe_dump({"scripts": [{"steps": [{"content": "seen"}]}]}))
    fleet = client(fleet_settings(redis_url, tmp_path))
    with start_worker(redis_url, concurrency=2, env_extra={"FLEET_WORKSPACE": str(tmp_path)}) as w:
        wait_for_workers(redis_url, [w.name], timeout_s=30)
        handle = fleet.submit(
            "describe", model=f"scripted:{script}", images=[tmp_path / "shot.png"]
        )
        assert handle.wait(timeout_s=30).status == "completed"
    root = handle.trace_id
    wait = WebDriverWait(browser, 30, poll_frequency=0.1)
    with serve_process(redis_url, port=free_port()) as url:
        browser.get(f"{url}/?trace={root}")
        wait.until(lambda b: statuses(b).get(root) == "completed")
        browser.find_elements(By.CSS_SELECTOR, ".node-head")[0].click()
        wait.until(lambda b: "[image PNG 8x8, " in b.find_element(By.ID, "message-list").text)
        assert base64.b64encode(shot).decode()[:40] not in browser.page_source
        assert browser.find_elements(By.CSS_SELECTOR, "img") == []
