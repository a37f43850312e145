"""Route 9: Flower shows nothing secret, `/metrics` included.

Attacks (on main): a task holding a key in quotes or brackets (`"sk-live-..."`,
`(token='...')`) kept it in the task's `argsrepr` and `shadow` name — the word-by-word
mask only knew bare words — so Flower's task list, task page and API showed it; Flower's
`/metrics` answered without the login the rest of Flower asked for, its `task` labels
being those shadow names.
Controls: `workers.naming` (every known secret value and credential shape redacted before
words are picked, punctuation ignored when judging a word), `workers.events` (every text
field of every event the app sends), and `fleetops.flower` (`/metrics` behind the same
login; task labels are the task kind only).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from fleet.client import Fleet
from tests.fleetkit import client, fleet_settings, wait_until
from tests.security.attacker import SECRET_ENV, leaked
from tests.security.conftest import HardenedFleet
from tests.test_flower_api import SEEN_TIMEOUT_S, answers, start_flower, stop, tasks_of

QUOTED = "sk-live-QUOTED0123456789abcdefXYZ"
BRACKETED = "Zx9Qv7Lm2Np4Rt6Wy8Kb1Hc3Jd5Fg0Sa"
LOGIN = ("ops", "flower-pw-123456")


@pytest.fixture
def flower(hardened: HardenedFleet, tmp_path: Path) -> Iterator[httpx.Client]:
    """`fleet flower` on loopback with a login, so `/metrics` has one to ask for."""
    process, port = start_flower(hardened.url, tmp_path, "--basic-auth", ":".join(LOGIN))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as http:
            wait_until(lambda: answers(http, "/healthcheck"), SEEN_TIMEOUT_S, "Flower to listen")
            yield http
    finally:
        stop(process)


def _fleet(hardened: HardenedFleet, tmp_path: Path) -> tuple[Fleet, str]:
    """A client, and a scripted model that delegates a task quoting a secret of the worker."""
    child_task = f'Child: deploy with key="{SECRET_ENV["GH_PAT"]}" and ({SECRET_ENV["DB_PWD"]})'
    script = tmp_path / "model.yaml"
    script.write_text(
        yaml.safe_dump(
            {
                "scripts": [
                    {"match": "^Child", "steps": [{"content": "child done"}]},
                    {
                        "match": ".*",
                        "steps": [
                            {"tool_calls": [{"name": "agent", "arguments": {"task": child_task}}]},
                            {"content": "root done"},
                        ],
                    },
                ]
            }
        )
    )
    env = {"FLEET_WORKSPACE_ROOTS": str(hardened.root), "FLEET_ALLOW_SCRIPTED": "1"}
    return client(fleet_settings(hardened.url, hardened.root, **env)), f"scripted:{script}"


@pytest.mark.integration
def test_flower_and_its_metrics_show_no_secret(
    hardened: HardenedFleet, flower: httpx.Client, tmp_path: Path
) -> None:
    flower.auth = httpx.BasicAuth(*LOGIN)
    fleet, model = _fleet(hardened, tmp_path)
    tasks = [
        f'Use "{QUOTED}" to call the API',
        f"Rotate (token='{BRACKETED}') today",
        f"Log in as `{SECRET_ENV['OPENAI_API_KEY']}`, then report",
    ]
    roots = [fleet.submit(task, model=model) for task in tasks]
    for handle in roots:
        assert handle.wait(timeout_s=60).status == "completed"

    def all_seen() -> bool:  # each root, its child and the resume: ≥ 3 tasks per tree
        return all(len(tasks_of(flower, h.trace_id)) >= 3 for h in roots)

    wait_until(all_seen, SEEN_TIMEOUT_S, "Flower to hear every task")
    shown = [flower.get("/api/tasks").text, flower.get("/tasks").text]
    for task_id in tasks_of(flower, roots[0].trace_id):
        shown.append(flower.get(f"/api/task/info/{task_id}").text)
        shown.append(flower.get(f"/task/{task_id}").text)
    metrics = flower.get("/metrics")
    assert metrics.status_code == 200
    shown.append(metrics.text)
    everything = "\n".join(shown)
    for secret in (QUOTED, BRACKETED, *SECRET_ENV.values()):
        assert secret[:16] not in everything, "not even a capped word's worth of it"
    assert leaked(everything) == []
    assert "[redacted]" in everything and "to call the API" in everything, "words still show"
    labels = {
        line.split('task="', 1)[1].split('"', 1)[0]
        for line in metrics.text.splitlines()
        if 'task="' in line
    }
    assert labels and all(re.fullmatch(r"fleet\.[a-z_]+|unknown", label) for label in labels), (
        labels
    )

    anonymous = httpx.get(f"{flower.base_url}/metrics", timeout=5.0)
    assert anonymous.status_code == 401, "the same login as every other page"
