"""Issue 39, route 4: `fleet archive --import` grafted crafted trees onto live ones.

A crafted file created a trace whose parent was another tree's live root (it then showed in
that tree's listing and `trace show`); a file whose root id equalled a live root ran
compaction, TTL and event moves on the live tree; unfinished traces and metadata the fleet
itself reads (an approved call) were accepted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from fleet.errors import ConfigError
from fleet.storage import keys
from fleet.storage.backends.redis.store import RedisStore
from fleetops.archive import export, import_file
from tests.test_compaction import explore_tree

Item = dict[str, Any]
Spoil = Callable[[list[Item], str], list[Item]]


def archived(redis_db: redis.Redis, tmp_path: Path) -> list[Item]:
    """The lines of an archive of one finished explore (root and one branch), dropped."""
    local = explore_tree(redis_db, tmp_path, branches=1)
    local.run("survey", model="m")
    assert isinstance(local.store, RedisStore)
    export(local.store, tmp_path / "good.jsonl", drop=True)
    return [json.loads(line) for line in (tmp_path / "good.jsonl").read_text().splitlines()]


def live_root(redis_db: redis.Redis, tmp_path: Path) -> str:
    """A tree that stays in Redis: the one a crafted file must not touch."""
    (tmp_path / "live").mkdir()
    return explore_tree(redis_db, tmp_path / "live", branches=1).run("live", model="m").trace_id


def field(item: Item, name: str) -> Any:
    return json.loads(item["fields"][name])


def set_field(item: Item, name: str, value: Any) -> Item:
    return {**item, "fields": {**item["fields"], name: json.dumps(value)}}


def child_line(items: list[Item]) -> int:
    """The index of the branch's trace line (the one with a parent)."""
    return next(
        i for i, it in enumerate(items) if it["kind"] == "trace" and "@" in it["fields"]["trace_id"]
    )


def graft(items: list[Item], live: str) -> list[Item]:
    i = child_line(items)
    return [*items[:i], set_field(items[i], "parent_trace_id", live), *items[i + 1 :]]


def reuse_live_root(items: list[Item], live: str) -> list[Item]:
    root = field(items[0], "trace_id")
    text = json.dumps(items).replace(json.dumps(root)[1:-1], live)
    moved: list[Item] = json.loads(text)
    return moved


def child_named_into_live(items: list[Item], live: str) -> list[Item]:
    child = field(items[child_line(items)], "trace_id")
    renamed = f"{live}@delegate-20260101000000-001"
    moved: list[Item] = json.loads(json.dumps(items).replace(child, renamed))
    return moved


def unfinished(items: list[Item], live: str) -> list[Item]:
    i = child_line(items)
    return [*items[:i], set_field(items[i], "status", "running"), *items[i + 1 :]]


def approved_call(items: list[Item], live: str) -> list[Item]:
    fields = {**items[0]["fields"], "r:approved_call": json.dumps("call_1")}
    return [{**items[0], "fields": fields}, *items[1:]]


def remote_call(items: list[Item], live: str) -> list[Item]:
    """A remote child's A2A call, 'sent': a poller would ask (and cancel) a task on its agent."""
    i = child_line(items)
    call = {"agent": "reviewer", "state": "sent", "task_id": "t-1", "context_id": "c-1"}
    fields = {**items[i]["fields"], "r:remote_call": json.dumps(call)}
    return [*items[:i], {**items[i], "fields": fields}, *items[i + 1 :]]


def stop_flag(items: list[Item], live: str) -> list[Item]:
    return [{**items[0], "fields": {**items[0]["fields"], "stop": "1"}}, *items[1:]]


def collaborator_elsewhere(items: list[Item], live: str) -> list[Item]:
    child, entry = items[0]["collaborators"][0]
    entry = json.dumps({**json.loads(entry), "trace_id": live})
    return [{**items[0], "collaborators": [[child, entry]]}, *items[1:]]


def event_elsewhere(items: list[Item], live: str) -> list[Item]:
    first_id, event = items[-1]["events"][0]
    moved = [first_id, json.dumps({**json.loads(event), "trace_id": live})]
    return [*items[:-1], {**items[-1], "events": [moved, *items[-1]["events"][1:]]}]


def good_tree_then_graft(items: list[Item], live: str) -> list[Item]:
    """A whole good tree first: validation must reach the second before writing the first."""
    second = json.loads(json.dumps(items).replace(field(items[0], "trace_id"), "second-root"))
    return [*items, *graft(second, live)]


@pytest.mark.parametrize(
    ("spoil", "line", "problem"),
    [
        (graft, "child", "is not in its tree"),
        (reuse_live_root, "root", "exists in this fleet's Redis"),
        (child_named_into_live, "child", "is not of tree"),
        (unfinished, "child", "is running: only ended trees are imported"),
        (approved_call, "root", "field 'r:approved_call' is the fleet's own"),
        (remote_call, "child", "field 'r:remote_call' is the fleet's own"),
        (stop_flag, "root", "field 'stop' is the fleet's own"),
        (collaborator_elsewhere, "root", "is not in its tree"),
        (event_elsewhere, "events", "which is not in tree"),
        (good_tree_then_graft, "second", "is not in its tree"),
    ],
)
def test_a_crafted_archive_is_refused_naming_its_line_and_writes_nothing(
    redis_db: redis.Redis, tmp_path: Path, spoil: Spoil, line: str, problem: str
) -> None:
    """Route: a crafted archive grafted a trace onto a live root, reused a live root's id,
    brought running traces and the fleet's own state. Control: the whole file is checked
    first; any refusal is one line naming FILE:LINE, and Redis is left as it was."""
    items = archived(redis_db, tmp_path)
    live = live_root(redis_db, tmp_path)
    crafted = spoil(items, live)
    path = tmp_path / "crafted.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in crafted))
    before = {k: redis_db.dump(k) for k in redis_db.scan_iter()}
    ttls = {k: redis_db.ttl(k) for k in before}

    with pytest.raises(ConfigError) as caught:
        import_file(RedisStore(redis_db), path, 600)

    child = child_line(items) + 1
    lines = {"root": 1, "child": child, "second": len(items) + child, "events": len(items)}
    expected = lines[line]
    message = str(caught.value)
    assert message.startswith(f"{path}:{expected}: ") and problem in message, message
    assert "\n" not in message
    assert {k: redis_db.dump(k) for k in redis_db.scan_iter()} == before, "nothing written"
    after = {k: redis_db.ttl(k) for k in before}
    # Counted down by the clock only (a second may pass while the import is refused).
    assert all(ttls[k] - 2 <= after[k] <= ttls[k] for k in ttls), "no TTL moved"
    assert redis_db.zcard(keys.children(live)) == 1, "the live root's children as they were"


def test_the_fleets_own_archive_of_a_tree_with_run_state_imports(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    """The refusals must not refuse the fleet's own exports: pending run state is left out
    of the file, so a tree that had some archives and comes back; the caller's metadata
    (whatever its keys) comes back as it was."""
    local = explore_tree(redis_db, tmp_path, branches=1)
    root = local.run("survey", model="m").trace_id
    store = local.store
    assert isinstance(store, RedisStore)
    trace = store.get_trace(root)
    metadata = {**trace.metadata, "approved_call": "the caller's", "mine": "kept"}
    fields = {"metadata": json.dumps(metadata), "r:approved_call": '"call_1"', "r:turn": "2"}
    fields["r:remote_call"] = json.dumps({"agent": "reviewer", "state": "sent", "task_id": "t"})
    for name, value in fields.items():
        redis_db.hset(keys.trace(root), name, value)
    path = tmp_path / "a.jsonl"
    export(store, path, drop=True)

    assert import_file(RedisStore(redis_db), path, 600).traces == 2
    back = RedisStore(redis_db).get_trace(root)
    assert back.metadata == metadata
    assert (back.run.turn, back.run.approved_call) == (2, None)  # a continue reads `turn`
    assert back.run.remote_call is None  # pending: a poller would ask its agent


def test_an_import_cut_short_runs_again_over_what_it_wrote(
    redis_db: redis.Redis, tmp_path: Path
) -> None:
    """The one tree whose ids may exist: the same tree, begun by an earlier run of the same
    import (its import mark matches), which then writes the traces it had not."""
    items = archived(redis_db, tmp_path)
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    assert import_file(RedisStore(redis_db), path, 600).traces == 2
    redis_db.delete(keys.trace(items[child_line(items)]["fields"]["trace_id"].strip('"')))

    assert import_file(RedisStore(redis_db), path, 600).traces == 1


@pytest.mark.integration
def test_fleet_archive_import_of_a_graft_is_one_line_and_exit_2(
    redis_client: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """The same through the CLI: one line on stderr naming FILE:LINE, exit 2."""
    items = archived(redis_client, tmp_path)
    live = live_root(redis_client, tmp_path)
    path = tmp_path / "graft.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in graft(items, live)))
    done = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "archive", "--import", str(path)],
        env={"PATH": "/usr/bin:/bin", "FLEET_REDIS_URL": redis_url, "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"{path}:{child_line(items) + 1}:" in line and "is not in its tree" in line
    assert redis_client.zcard(keys.children(live)) == 1
