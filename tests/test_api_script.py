"""docs/api.md's curl-only session, run exactly as written against a real `fleet serve`.

The script is read from between the doc's `api-script` markers and run by bash (curl and
jq, no Python client) against `fleet serve` as a process, over a real worker process and
Redis, with a scripted model. Then the fleet's own store is asked what the script claims.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from fleet.storage.backends.redis.store import RedisStore
from tests.fleetkit import client, fleet_settings
from tests.servekit import serve_process

pytestmark = pytest.mark.integration

DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"
TOKEN = "api-script-token-0123456789abcdef"


def the_script() -> str:
    """The shell block between `<!-- api-script:start -->` and `<!-- api-script:end -->`."""
    text = DOC.read_text()
    found = re.search(
        r"<!-- api-script:start -->\n```sh\n(.*?)```\n<!-- api-script:end -->", text, re.S
    )
    assert found, "docs/api.md holds the script between its markers"
    return found.group(1)


def model_script(path: Path) -> str:
    looping = [
        {"tool_calls": [{"name": "list_dir", "arguments": {"path": "/".join(["."] * n)}}]}
        for n in range(1, 60)
    ]
    body = {
        "latency_ms": 100,
        "scripts": [
            {"match": "^survey", "steps": looping},
            {"match": ".*", "steps": [{"content": "answer: {last_user}"}]},
        ],
    }
    path.write_text(yaml.safe_dump(body))
    return f"scripted:{path}"


def test_the_documented_curl_session_runs_on_a_real_fleet(worker_url: str, tmp_path: Path) -> None:
    model = model_script(tmp_path / "model.yaml")
    with serve_process(worker_url, FLEET_SERVE_TOKEN=TOKEN, FLEET_WORKSPACE=str(tmp_path)) as url:
        run = subprocess.run(
            ["bash", "-c", the_script()],
            env={**os.environ, "FLEET_URL": url, "FLEET_SERVE_TOKEN": TOKEN, "MODEL": model},
            capture_output=True,
            text=True,
            timeout=240,
        )
    print(run.stdout)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    out = run.stdout
    explore = re.search(r"^explore: (\S+)$", out, re.M)
    assert explore, out
    root = explore.group(1)
    assert "explore ended: completed" in out
    assert "long tree: stopped" in out
    assert "continued: completed" in out and "regenerated: completed" in out
    assert '"kind":"finish"' in out and f'"trace_id":"{root}"' in out, "the stream was followed"
    fleet = client(fleet_settings(worker_url, tmp_path))
    try:
        trace = fleet.trace(root)
        assert trace.status == "completed"
        assert len(fleet.store.children(root)) == 2, "one branch per task"
        messages = fleet.store.messages(root)
        asked = [
            m for m in messages if m.role == "user" and m.content == "which branch found more?"
        ]
        assert len(asked) == 1, "the regenerate added no message"
        answers = [m for m in messages if m.parent_sequence == asked[0].sequence]
        assert [m.content for m in answers] == ["answer: which branch found more?"] * 2
        assert trace.head_sequence == answers[-1].sequence, "the regenerated answer is the head"
        stopped = [t for t in fleet.store.list_traces(50) if t.task == "survey every file"]
        assert [t.status for t in stopped] == ["stopped"]
    finally:
        assert isinstance(fleet.store, RedisStore)
        fleet.store.close()
