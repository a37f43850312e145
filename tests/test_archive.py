"""`fleet archive`: finished trees to JSONL and back, read and continued; hostile files refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from fleet.errors import ConfigError
from fleet.models import Trace
from fleet.storage import keys
from fleet.storage.backends.redis.compact import compact_tree
from fleet.storage.backends.redis.store import RedisStore
from fleet.storage.compaction import PACKED_FIELD
from fleet.testing import ScriptedModel, text
from fleetops.archive import export, import_file, read_file
from tests.test_compaction import everything, explore_tree


def test_a_tree_archived_dropped_and_imported_reads_the_same(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    local = explore_tree(redis_db, tmp_path, branches=5)
    root = local.run("survey", model="m").trace_id
    store = local.store
    assert isinstance(store, RedisStore)
    compact_tree(redis_db, root, 3600)  # archived from its compacted form
    before = everything(store, root)
    path = tmp_path / "trees.jsonl"

    done = export(store, path, drop=True)

    assert (done.trees, done.traces) == (1, 6)
    assert not redis_db.exists(keys.trace(root)) and redis_db.zcard(keys.TRACES) == 0
    assert len(path.read_text().splitlines()) == 7, "six traces, then the events"
    assert import_file(RedisStore(redis_db), path, 600).traces == 6
    assert everything(RedisStore(redis_db), root) == before
    assert list(redis_db.hkeys(keys.trace(root))) == [PACKED_FIELD], "imported compacted"
    assert 0 < redis_db.ttl(keys.trace(root)) <= 600
    assert import_file(RedisStore(redis_db), path, 600).traces == 0, "nothing written twice"
    local.runtime.clients["m"] = ScriptedModel([text("still here")])
    assert local.continue_trace(root, "and now?").answer == "still here"


def test_an_unfinished_tree_is_not_archived(redis_db: redis.Redis, tmp_path: Path) -> None:
    store = RedisStore(redis_db)
    store.create_trace(Trace(trace_id="r", root_trace_id="r", task="t"))
    with pytest.raises(ConfigError, match="'r' has not ended"):
        export(store, tmp_path / "a.jsonl", ["r"])
    assert export(store, tmp_path / "b.jsonl").trees == 0, "skipped when not named"
    with pytest.raises(ConfigError, match="exists"):
        export(store, tmp_path / "b.jsonl")


def _good_lines(redis_db: redis.Redis, tmp_path: Path) -> list[str]:
    local = explore_tree(redis_db, tmp_path, branches=1)
    root = local.run("survey", model="m").trace_id
    assert isinstance(local.store, RedisStore)
    export(local.store, tmp_path / "good.jsonl", drop=True)
    assert not redis_db.exists(keys.trace(root))
    return (tmp_path / "good.jsonl").read_text().splitlines()


def _trace_line(fields: dict[str, str]) -> str:
    return json.dumps({"kind": "trace", "fields": fields, "collaborators": []})


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (lambda lines: ["{not json", *lines], ":1: "),
        (lambda lines: ['{"kind": "shell"}', *lines], "unknown line kind 'shell'"),
        (lambda lines: lines[:-1], "ends inside a tree"),
        (
            lambda lines: [_trace_line({"trace_id": '"a:b"'}), *lines],
            ":1: ",
        ),
        (
            lambda lines: [
                lines[0].replace('\\"role\\":\\"system\\"', '\\"role\\":\\"root\\"'),
                *lines[1:],
            ],
            ":1: ",
        ),
        (  # a field no release of the fleet wrote, planted for a later one to read
            lambda lines: [
                lines[0].replace(
                    '\\"role\\":\\"system\\"', '\\"role\\":\\"system\\",\\"run_as\\":1'
                ),
                *lines[1:],
            ],
            "Message field 'run_as' is not this release's",
        ),
        (
            lambda lines: [*lines[:-1], lines[-1].replace('[["', '[["../x', 1)],
            "is not a stream entry id",
        ),
        (
            lambda lines: [*lines[:-1], lines[-1].replace('"root": "', '"root": "other-', 1)],
            "is not of tree 'other-",
        ),
    ],
)
def test_a_hostile_archive_is_one_line_and_writes_nothing(
    redis_db: redis.Redis, tmp_path: Path, spoil: object, problem: str
) -> None:
    lines = _good_lines(redis_db, tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(spoil(lines)) + "\n")  # type: ignore[operator]
    keys_before = redis_db.dbsize()
    with pytest.raises(ConfigError, match=problem) as caught:
        import_file(RedisStore(redis_db), bad, 600)
    assert "\n" not in str(caught.value) and str(bad) in str(caught.value)
    assert redis_db.dbsize() == keys_before, "nothing half-written"


def test_the_good_file_reads(redis_db: redis.Redis, tmp_path: Path) -> None:
    lines = _good_lines(redis_db, tmp_path)
    assert len(read_file(tmp_path / "good.jsonl")) == 1 and len(lines) == 3


@pytest.mark.integration
def test_fleet_archive_and_trace_show(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    local = explore_tree(redis_client, tmp_path, branches=2)
    root = local.run("survey", model="m").trace_id
    env = {**os.environ, "FLEET_REDIS_URL": redis_url, "FLEET_RETENTION_S": "900"}
    fleet = [sys.executable, "-m", "fleetops.cli.main"]
    path = tmp_path / "out.jsonl"

    out = subprocess.run(
        [*fleet, "archive", str(path), "--drop"], env=env, capture_output=True, text=True
    )
    gone = subprocess.run([*fleet, "trace", "show", root], env=env, capture_output=True, text=True)
    back = subprocess.run(
        [*fleet, "archive", "--import", str(path)], env=env, capture_output=True, text=True
    )
    shown = subprocess.run([*fleet, "trace", "show", root], env=env, capture_output=True, text=True)
    again = subprocess.run([*fleet, "archive", str(path)], env=env, capture_output=True, text=True)

    assert out.returncode == 0 and out.stdout.startswith("archived 1 trees (3 traces)"), out.stderr
    assert gone.returncode == 2 and "no trace" in gone.stderr
    assert back.returncode == 0 and back.stdout.startswith("imported 1 trees (3 traces)")
    assert shown.returncode == 0 and "summary" in shown.stdout and "Branch 1" in shown.stdout
    assert redis_client.ttl(keys.trace(root)) <= 900
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.count("\n") == 1 and "exists" in again.stderr


def test_import_with_roots_or_drop_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env["FLEET_REDIS_URL"] = "redis://127.0.0.1:1/0"  # never reached: refused before
    command = [sys.executable, "-m", "fleetops.cli.main", "archive", "--import", "f.jsonl"]
    for extra in (["some-root"], ["--drop"]):
        result = subprocess.run(
            [*command, *extra], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert "--import reads FILE back" in line


def test_a_memory_store_has_no_archive_and_says_so_in_one_line(tmp_path: Path) -> None:
    from fleet.storage.backends.memory.store import MemoryStore

    with pytest.raises(ConfigError, match="needs the Redis store") as caught:
        export(MemoryStore(), tmp_path / "a.jsonl")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "a.jsonl").exists() and not list(tmp_path.iterdir())
