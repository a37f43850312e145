"""Images on real workers (issue 26's done-when): `fleet run --image` over the OpenAI wire
sends one `image_url` part with the data; `read_image` sends the image in the next request;
over the Anthropic wire both arrive as `image` blocks; Redis holds each image once, and no
other key, event or worker log holds its bytes."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from fleet.llm.openai import TOOL_IMAGES_NOTE
from fleet.storage import keys
from tests import imagekit
from tests.fake_vision import ANSWER, VisionProvider
from tests.procs import WorkerProcess
from tests.test_cli_fleet_run import cli_env, fleet_cli
from tests.test_fleet_recovery import database_url, start_workers

pytestmark = pytest.mark.integration

IMAGES_DB = 12
SHOT = imagekit.png(32, 16)
SHOT_B64 = base64.b64encode(SHOT).decode()
DATA_URL = f"data:image/png;base64,{SHOT_B64}"


@pytest.fixture(scope="module")
def provider() -> Iterator[VisionProvider]:
    with VisionProvider(SHOT) as server:
        yield server


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory, provider: VisionProvider) -> tuple[Path, Path]:
    """(workspace with shot.png, fleet.yaml naming both wires of the fake provider)."""
    workspace = tmp_path_factory.mktemp("workspace")
    (workspace / "shot.png").write_bytes(SHOT)
    operator = tmp_path_factory.mktemp("operator")
    config = {
        "providers": {
            "fakeoai": {"kind": "openai", "base_url": f"{provider.url}/v1"},
            "fakeant": {"kind": "anthropic", "base_url": provider.url},
        },
        "models": {
            "eyes-openai": {"provider": "fakeoai", "name": "gpt-fake"},
            "eyes-anthropic": {"provider": "fakeant", "name": "claude-fake"},
        },
    }
    (operator / "fleet.yaml").write_text(yaml.safe_dump(config))
    return workspace, operator / "fleet.yaml"


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, IMAGES_DB)


@pytest.fixture(scope="module")
def workers(url: str, dirs: tuple[Path, Path]) -> Iterator[list[WorkerProcess]]:
    workspace, config = dirs
    env = {"FLEET_WORKSPACE": str(workspace), "FLEET_CONFIG": str(config)}
    env["FLEET_WORKSPACE_ROOTS"] = str(workspace)  # fleet.yaml is outside every root
    with contextlib.ExitStack() as stack:
        yield start_workers(stack, url, 1, concurrency=4, env_extra=env)


def run(
    url: str, dirs: tuple[Path, Path], workers: list[WorkerProcess], model: str, task: str
) -> dict[str, Any]:
    """`fleet run --image shot.png --json` from the workspace; the result object."""
    workspace, config = dirs
    env = cli_env(url, workspace, FLEET_CONFIG=str(config), FLEET_WORKSPACE_ROOTS=str(workspace))
    done = fleet_cli(["run", "--image", "shot.png", "--model", model, "--json", task], env)
    assert done.returncode == 0, done.stdout + done.stderr + workers[0].log()[-3000:]
    assert SHOT_B64[:60] not in done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["status"] == "completed" and result["answer"] == ANSWER
    return result


def image_keys(url: str, root: str) -> list[str]:
    with redis.Redis.from_url(url, decode_responses=True) as conn:
        return sorted(conn.scan_iter(match=f"{keys.PREFIX}:image:{root}:*"))


def bytes_outside_image_keys(url: str) -> list[str]:
    """Every key but the image keys whose value holds the image's base64 (none should)."""
    found = []
    with redis.Redis.from_url(url, decode_responses=True) as conn:
        for key in conn.scan_iter(match="*"):
            if not key.startswith(f"{keys.PREFIX}:image:") and SHOT_B64[:60] in values(conn, key):
                found.append(key)
    return found


def values(conn: redis.Redis, key: str) -> str:
    """Everything a key holds, as one string."""
    kind = conn.type(key)
    if kind == "string":
        return str(conn.get(key))
    if kind == "hash":
        return json.dumps(conn.hgetall(key))
    if kind == "list":
        return json.dumps(conn.lrange(key, 0, -1))
    if kind == "set":
        return json.dumps(sorted(conn.smembers(key)))
    if kind == "zset":
        return json.dumps(conn.zrange(key, 0, -1))
    if kind == "stream":
        return json.dumps(conn.xrange(key))
    return ""


def test_run_image_sends_one_image_url_part_with_the_data(
    url: str, dirs: tuple[Path, Path], workers: list[WorkerProcess], provider: VisionProvider
) -> None:
    provider.clear()
    result = run(url, dirs, workers, "eyes-openai", "describe the picture")

    (body,) = provider.bodies("/v1/chat/completions")
    parts = [p for m in body["messages"] if isinstance(m["content"], list) for p in m["content"]]
    images = [p for p in parts if p["type"] == "image_url"]
    assert images == [{"type": "image_url", "image_url": {"url": DATA_URL}}]
    assert image_keys(url, result["trace_id"]) != []
    assert len(image_keys(url, result["trace_id"])) == 1


def test_read_image_sends_the_image_in_the_next_request_stored_once(
    url: str, dirs: tuple[Path, Path], workers: list[WorkerProcess], provider: VisionProvider
) -> None:
    provider.clear()
    result = run(url, dirs, workers, "eyes-openai", "call read_image on the file")

    first, second = provider.bodies("/v1/chat/completions")
    assert "tools" in first and any(t["function"]["name"] == "read_image" for t in first["tools"])
    last = second["messages"][-1]
    assert second["messages"][-2]["role"] == "tool"
    assert last["role"] == "user" and last["content"][0]["text"] == TOOL_IMAGES_NOTE
    assert last["content"][1] == {"type": "image_url", "image_url": {"url": DATA_URL}}
    # attached with --image and read again by the tool: the same bytes, one key
    assert len(image_keys(url, result["trace_id"])) == 1
    assert bytes_outside_image_keys(url) == []
    for worker in workers:
        assert SHOT_B64[:60] not in worker.log()


def test_over_the_anthropic_wire_images_are_image_blocks(
    url: str, dirs: tuple[Path, Path], workers: list[WorkerProcess], provider: VisionProvider
) -> None:
    provider.clear()
    result = run(url, dirs, workers, "eyes-anthropic", "call read_image on the file")

    first, second = provider.bodies("/v1/messages")
    source = {"type": "base64", "media_type": "image/png", "data": SHOT_B64}
    block = {"type": "image", "source": source}
    assert block in unmarked(first["messages"][0]["content"])
    results = [
        b for m in second["messages"] for b in m["content"] if b.get("type") == "tool_result"
    ]
    (looked,) = results
    assert block in unmarked(looked["content"])
    assert len(image_keys(url, result["trace_id"])) == 1


def unmarked(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks without their prompt-cache breakpoints (issue 27 marks the last one)."""
    return [{k: v for k, v in b.items() if k != "cache_control"} for b in blocks]


def test_an_image_url_to_loopback_is_refused_unless_the_operator_allows_it(
    url: str, dirs: tuple[Path, Path], provider: VisionProvider
) -> None:
    workspace, config = dirs
    env = cli_env(url, workspace, FLEET_CONFIG=str(config), FLEET_WORKSPACE_ROOTS=str(workspace))
    image = f"{provider.url}/shot.png"  # 127.0.0.1: the SSRF guard refuses it
    args = ["run", "--image", image, "--model", "eyes-openai", "--inline", "look"]
    provider.clear()
    done = fleet_cli(args, env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "image refused" in line and "not a public address" in line
    assert provider.seen == []  # not fetched, no model call

    allowed = fleet_cli(args, {**env, "FLEET_WEB_ALLOW": "127.0.0.1"})  # the control
    assert allowed.returncode == 0, allowed.stderr
    assert [path for path, _ in provider.seen][0] == "GET /shot.png"
    (body,) = provider.bodies("/v1/chat/completions")
    assert DATA_URL in json.dumps(body)
