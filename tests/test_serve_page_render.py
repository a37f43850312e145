"""The render time of wide trees in headless Chromium (100 and 1,000 branches).

Measured, not asserted (speed is judged in bench/): the numbers go to docs/observability.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from fleet.models import Event, Trace, TraceStats
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel
from tests.browserkit import page_value, screenshot, script_errors
from tests.servekit import page_config, serving
from tests.test_serve_page_views import actions_with, segment_kinds, store

pytestmark = pytest.mark.integration
__all__ = ["store"]  # the fixture, used by name


def wide_tree(store: RedisStore, branches: int) -> tuple[str, int]:
    """A finished explore of `branches` branches written straight into the store; its root
    and the number of events its stream holds."""
    root, t0 = "wide-root", 1_800_000_000_000
    stats = TraceStats(prompt_tokens=100, completion_tokens=20, cost_usd=0.001)
    traces = [
        Trace(
            trace_id=root,
            root_trace_id=root,
            task="wide",
            status="completed",
            created_at_ms=t0 - 100,
            finished_at_ms=t0 + 9000,
        )
    ]
    events = [
        Event(kind="trace", trace_id=root, status="queued", at_ms=t0 - 100),
        Event(kind="trace", trace_id=root, status="running", at_ms=t0 - 50),
        Event(kind="trace", trace_id=root, status="waiting", at_ms=t0),
    ]
    for i in range(1, branches + 1):
        child = f"{root}@explore-{i:04d}"
        traces.append(
            Trace(
                trace_id=child,
                root_trace_id=root,
                parent_trace_id=root,
                mode="explore",
                name=f"explore-{i:04d}",
                task=f"Branch {i}",
                status="completed",
                stats=stats,
                created_at_ms=t0 + i,
                finished_at_ms=t0 + 3000 + 3 * i,
            )
        )
        data = {"parent_trace_id": root, "name": f"explore-{i:04d}", "mode": "explore"}
        events += [
            Event(kind="collaborator", trace_id=child, status="queued", data=data, at_ms=t0 + i),
            Event(kind="trace", trace_id=child, status="running", at_ms=t0 + 1000 + 2 * i),
            Event(kind="message", trace_id=child, data={"role": "assistant"}, at_ms=t0 + 1500),
            Event(kind="finish", trace_id=child, status="completed", at_ms=t0 + 3000 + 3 * i),
        ]
    events.append(Event(kind="finish", trace_id=root, status="completed", at_ms=t0 + 9000))
    store.create_traces(traces)
    for event in events:
        store.emit(root, event)
    return root, len(events)


@pytest.mark.parametrize("branches", [100, 1000])
def test_render_time_of_a_wide_tree(
    store: RedisStore,
    browser: webdriver.Chrome,
    tmp_path: Path,
    branches: int,
    record_property: Any,
) -> None:
    """Measured, not asserted (speed is judged in bench/): every row is there, few in the DOM."""
    root, events = wide_tree(store, branches)
    local = actions_with(store, tmp_path, ScriptedModel())
    wait = WebDriverWait(browser, 120, poll_frequency=0.05)
    with serving(page_config(local)) as url:
        browser.get(f"{url}/?trace={root}&view=timeline")
        wait.until(lambda b: page_value(b, "events") == events)
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".node")) == branches + 1)
        wait.until(lambda b: page_value(b, "timeline.rows.size") == branches + 1)
        timings = {
            "listed_ms": round(page_value(browser, "timings.listed_ms")),
            "all_events_ms": round(page_value(browser, "lastEventAt")),
            "redraw_ms": redraw_ms(browser),
            "dom_rows": len(browser.find_elements(By.CSS_SELECTOR, ".tl-row")),
        }
        assert timings["dom_rows"] < 80, "the timeline's rows are virtualised"
        if branches == 100:
            screenshot(browser, "serve-timeline-wide")
        browser.execute_script("document.getElementById('timeline-scroll').scrollTop = 1e9")
        last = f"{root}@explore-{branches:04d}"
        wait.until(lambda b: segment_kinds(b, last) == {"queued", "running"})
        assert script_errors(browser) == []
    record_property("render", timings)
    print(f"\nrender at {branches} branches: {json.dumps(timings)}")  # noqa: T201


def redraw_ms(browser: webdriver.Chrome) -> float:
    """The median of 5 full redraws of the timeline (ms)."""
    took = browser.execute_script(
        "const t = window.fleetPage.timeline; const out = [];"
        "for (let i = 0; i < 5; i++) { window.fleetPage.draw(); out.push(t.drawMs); }"
        "return out.sort((a, b) => a - b)[2];"
    )
    return round(float(took), 2)
