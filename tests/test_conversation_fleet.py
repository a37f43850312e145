"""Continue, rewind and ask a person on real worker processes and a real Redis."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from celery import Celery

from fleet.client import Fleet
from fleet.conversation.continuation import branches
from fleet.conversation.human import waiting_on
from fleet.storage import keys
from fleetops.serve.listing import TraceFilter, list_traces
from tests.fleetkit import wait_until
from tests.procs import WorkerProcess, read_until_exit
from tests.test_fleet_recovery import database_url, fleet_client, start_workers

pytestmark = pytest.mark.integration

CONVERSATION_DB = 13
FLEET = [sys.executable, "-m", "fleetops.cli.main"]
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspace")


@pytest.fixture(scope="module")
def url(redis_url: str) -> str:
    return database_url(redis_url, CONVERSATION_DB)


@pytest.fixture(scope="module")
def workers(url: str, workspace: Path) -> Iterator[list[WorkerProcess]]:
    """Two thread-pool workers; their sweepers look every half second (human timeouts)."""
    env = {"FLEET_WORKSPACE": str(workspace), "FLEET_SWEEP_INTERVAL_S": "0.5"}
    with contextlib.ExitStack() as stack:
        yield start_workers(stack, url, 2, concurrency=4, env_extra=env)


@pytest.fixture
def fleet(url: str, workspace: Path, workers: list[WorkerProcess]) -> Iterator[Fleet]:
    with fleet_client(url, url, workspace) as client:
        yield client


@pytest.fixture
def control(url: str) -> Iterator[Celery]:
    app = Celery("conversation-tests", broker=url, set_as_current=False)
    yield app
    app.close()


def script(path: Path, steps: list[dict[str, Any]]) -> str:
    path.write_text(yaml.safe_dump({"scripts": [{"match": ".*", "steps": steps}]}))
    return f"scripted:{path}"


def cli_env(url: str, workspace: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    fleet = {"FLEET_REDIS_URL": url, "FLEET_WORKSPACE": str(workspace)}
    return env | fleet | {"FLEET_ALLOW_SCRIPTED": "1"}


def cli(url: str, workspace: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FLEET, *args],
        env=cli_env(url, workspace),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], part: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: error: "), result.stderr
    assert part in lines[0], lines[0]


def only_on(control: Celery, workers: list[WorkerProcess], worker: WorkerProcess) -> None:
    """Let only `worker` take tasks from fleet.main."""
    for other in workers:
        names = [other.name]
        if other is worker:
            control.control.add_consumer("fleet.main", destination=names, reply=True)
        else:
            control.control.cancel_consumer("fleet.main", destination=names, reply=True)


def received(worker: WorkerProcess, shadow: str) -> int:
    return len(re.findall(rf"Task {re.escape(shadow)}\[[^\]]+\] received", worker.log()))


def test_a_root_continued_twice_keeps_one_tree_on_different_workers(
    fleet: Fleet, workers: list[WorkerProcess], control: Celery, tmp_path: Path
) -> None:
    steps = [{"content": f"answer {i}: {{last_user}} ({{turn}} before)"} for i in (1, 2, 3)]
    model = script(tmp_path / "m.yaml", steps)
    a, b = workers
    try:
        only_on(control, workers, a)
        root = fleet.submit("first turn", model=model).wait(timeout_s=TIMEOUT_S)
        only_on(control, workers, b)
        second = fleet.continue_trace(root.trace_id, "second turn").wait(timeout_s=TIMEOUT_S)
        only_on(control, workers, a)
        third = fleet.continue_trace(root.trace_id, "third turn").wait(timeout_s=TIMEOUT_S)
    finally:
        for worker in workers:
            control.control.add_consumer("fleet.main", destination=[worker.name], reply=True)
    assert root.answer == "answer 1: first turn (0 before)"
    assert second.answer == "answer 2: second turn (1 before)"
    assert third.answer == "answer 3: third turn (2 before)", "the whole history was sent"
    messages = fleet.store.messages(root.trace_id)
    user_turns = [m.content for m in messages if m.role == "user"]
    assert user_turns == ["first turn", "second turn", "third turn"]
    assert [t.trace_id for t in fleet.store.list_traces()] == [root.trace_id], "one tree"
    shadow = "fleet.main: first turn"
    assert (received(a, shadow), received(b, shadow)) == (2, 1), "turns 1 and 3 on a, 2 on b"


def test_rewind_reruns_from_a_point_and_show_lists_both_branches(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    steps = [{"content": "v{turn}: {last_user}"}]
    model = script(tmp_path / "m.yaml", steps)
    root = fleet.submit("draft it", model=model).wait(timeout_s=TIMEOUT_S)
    fleet.continue_trace(root.trace_id, "make it blue").wait(timeout_s=TIMEOUT_S)
    first_answer = next(m for m in fleet.store.messages(root.trace_id) if m.role == "assistant")
    rewound = cli(
        url,
        workspace,
        "run",
        "--continue",
        root.trace_id,
        "--after-sequence",
        str(first_answer.sequence),
        "make it red",
    )
    assert rewound.returncode == 0, rewound.stderr
    assert rewound.stdout.strip() == "v1: make it red", "re-ran from message 3 on"
    trace = fleet.trace(root.trace_id)
    found = branches(fleet.store.messages(root.trace_id), trace.head_sequence)
    assert sorted(b["last"]["content"] for b in found) == ["v1: make it blue", "v1: make it red"]
    shown = cli(url, workspace, "trace", "show", root.trace_id)
    assert shown.returncode == 0, shown.stderr
    assert "conversation: 2 branch(es)" in shown.stdout
    assert "'make it blue'" in shown.stdout and "'make it red'" in shown.stdout


def test_regenerate_answers_message_n_again_with_no_new_message(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    model = script(tmp_path / "m.yaml", [{"content": "v{turn}: {last_user}"}])
    root = fleet.submit("draft it", model=model).wait(timeout_s=TIMEOUT_S)
    fleet.continue_trace(root.trace_id, "make it blue").wait(timeout_s=TIMEOUT_S)
    second = [m for m in fleet.store.messages(root.trace_id) if m.role == "user"][-1]
    again = cli(
        url,
        workspace,
        "run",
        "--continue",
        root.trace_id,
        "--after-sequence",
        str(second.sequence),
        "--regenerate",
    )
    assert again.returncode == 0, again.stderr
    assert f"regenerating {root.trace_id} from {second.sequence}" in again.stderr
    messages = fleet.store.messages(root.trace_id)
    answers = [m for m in messages if m.parent_sequence == second.sequence]
    assert len(answers) == 2, "the first answer stays, off the main path"
    assert again.stdout.strip() == answers[-1].content == "v1: make it blue"
    assert [m.content for m in messages if m.role == "user"] == ["draft it", "make it blue"]
    assert fleet.trace(root.trace_id).head_sequence == answers[-1].sequence
    assert_one_line_error(
        cli(
            url,
            workspace,
            "run",
            "--continue",
            root.trace_id,
            "--after-sequence",
            str(answers[-1].sequence),
            "--regenerate",
        ),
        "is an answer of the model",
    )


def test_fleet_compact_summarises_a_finished_root_through_a_side_branch(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    model = script(tmp_path / "m.yaml", [{"content": "noted: {last_user}"}])
    root = fleet.submit("remember these", model=model).wait(timeout_s=TIMEOUT_S)
    for turn in range(6):
        fleet.continue_trace(root.trace_id, f"fact {turn}").wait(timeout_s=TIMEOUT_S)
    done = cli(url, workspace, "compact", root.trace_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"compacted {root.trace_id}: messages ")
    after = fleet.continue_trace(root.trace_id, "and now?").wait(timeout_s=TIMEOUT_S)
    assert after.status == "completed"
    assert_one_line_error(cli(url, workspace, "compact", "no-such-trace"), "no trace")


def ask_script(tmp_path: Path) -> str:
    steps: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which colour?"}}]},
        {"content": "painted it {last_tool}"},
    ]
    return script(tmp_path / "ask.yaml", steps)


def no_task_running(control: Celery) -> bool:
    active = control.control.inspect(timeout=1.0).active() or {}
    return bool(active) and all(not tasks for tasks in active.values())


def test_ask_human_waits_holding_nothing_and_fleet_reply_resumes(
    url: str, workspace: Path, fleet: Fleet, control: Celery, tmp_path: Path
) -> None:
    # Off a terminal nobody can answer: `fleet run` prints the question and how to answer
    # it, and exits 3 (as the README says), leaving the tree waiting with no slot held.
    run = subprocess.run(
        [*FLEET, "run", "--model", ask_script(tmp_path), "paint the shed"],
        env=cli_env(url, workspace),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    (trace,) = fleet.waiting()
    assert run.returncode == 3, run.stderr
    assert "? Which colour?" in run.stderr and f"fleet reply {trace.trace_id}" in run.stderr
    assert run.stdout == ""
    assert trace.status == "waiting" and waiting_on(trace) is not None
    (person,) = fleet.store.collaborators(trace.trace_id)
    assert (person.type, person.status, person.summary) == ("human", "waiting", "Which colour?")
    with redis.Redis.from_url(url) as conn:
        assert not conn.exists(keys.lease(trace.trace_id)), "no runner holds it"
        assert conn.zscore(keys.RUNNING, trace.trace_id) is None
    wait_until(lambda: no_task_running(control), TIMEOUT_S, "no task to run")
    listed = cli(url, workspace, "trace", "list", "--waiting")
    assert f"{trace.trace_id}  waiting" in listed.stdout and "? Which colour?" in listed.stdout
    api = list_traces(fleet.store, TraceFilter(waiting="person"))  # `?waiting=person`
    assert [t["trace_id"] for t in api["traces"]] == [trace.trace_id]
    replied = cli(url, workspace, "reply", trace.trace_id, "green")
    assert replied.returncode == 0, replied.stderr
    done = fleet.wait(trace.trace_id, TIMEOUT_S)
    assert done.status == "completed" and done.answer == "painted it green"
    assert fleet.store.collaborators(done.trace_id)[0].status == "completed"
    assert cli(url, workspace, "trace", "list", "--waiting").stdout == ""


def test_on_a_terminal_fleet_run_prompts_for_the_reply(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*FLEET, "run", "--model", ask_script(tmp_path), "paint the fence"],
        env={**cli_env(url, workspace), "TERM": "xterm"},
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    wait_until(lambda: bool(fleet.waiting()), TIMEOUT_S, "the question")
    os.write(controller, b"blue\n")
    screen = read_until_exit(controller, process, TIMEOUT_S)
    assert process.returncode == 0, screen
    assert "? Which colour?" in screen and "reply> " in screen
    assert "painted it blue" in screen


def test_stop_and_timeout_end_a_wait_cleanly(fleet: Fleet, tmp_path: Path) -> None:
    model = ask_script(tmp_path)
    stopped = fleet.submit("paint the gate", model=model)
    timed = fleet.submit("paint the door", model=model, human_timeout_s=1)
    wait_until(lambda: len(fleet.waiting()) == 2, TIMEOUT_S, "both to ask")
    fleet.stop(stopped.trace_id)
    assert fleet.trace(stopped.trace_id).status == "stopped"
    assert fleet.store.collaborators(stopped.trace_id)[0].status == "stopped"
    done = timed.wait(timeout_s=TIMEOUT_S)  # a worker's sweeper answers it after 1 s
    assert done.status == "completed"
    assert (done.answer or "").startswith("painted it No reply from a person within 1 s")
    assert fleet.store.collaborators(done.trace_id)[0].status == "failed"
    again = fleet.continue_trace(stopped.trace_id, "red, please").wait(timeout_s=TIMEOUT_S)
    assert again.status == "completed", "a stopped wait can be continued (its call healed)"


@pytest.mark.parametrize(
    ("args", "part"),
    [
        (["reply", "no-such-trace", "green"], "no trace 'no-such-trace'"),
        (["run", "--continue", "no-such-trace", "more"], "no trace 'no-such-trace'"),
        (["run", "--after-sequence", "2", "more"], "--after-sequence needs --continue"),
        (["run", "--continue", "x", "--regenerate"], "--regenerate needs --continue TRACE_ID"),
        (
            ["run", "--continue", "x", "--after-sequence", "2", "--regenerate", "more"],
            "--regenerate takes no message",
        ),
        (["run", "--continue", "x"], "give the message"),
        (["run"], "give the task"),
    ],
)
def test_bad_ids_are_one_line_errors(url: str, workspace: Path, args: list[str], part: str) -> None:
    assert_one_line_error(cli(url, workspace, *args), part)


def test_reply_or_continue_that_does_not_apply_writes_nothing(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    done = fleet.submit("say hi", model=script(tmp_path / "m.yaml", [{"content": "hi"}]))
    trace = done.wait(timeout_s=TIMEOUT_S)

    def state() -> tuple[dict[str, Any], list[Any]]:
        # stats.duration_ms lands just after the finish event: not part of what is compared
        found = fleet.trace(trace.trace_id).model_dump(exclude={"stats"})
        return found, fleet.store.messages(trace.trace_id)

    before = state()
    assert_one_line_error(
        cli(url, workspace, "reply", trace.trace_id, "green"), "is not waiting on a person"
    )
    assert_one_line_error(
        cli(url, workspace, "run", "--continue", trace.trace_id, "--after-sequence", "99", "x"),
        "has no message 99",
    )
    asking = fleet.submit("paint the wall", model=ask_script(tmp_path))
    wait_until(lambda: bool(fleet.waiting()), TIMEOUT_S, "the question")
    assert_one_line_error(
        cli(url, workspace, "run", "--continue", asking.trace_id, "more"), "waiting on a person"
    )
    assert state() == before
    fleet.stop(asking.trace_id)


def test_fleet_batch_records_the_question_and_the_trace_stays_resumable(
    url: str, workspace: Path, fleet: Fleet, tmp_path: Path
) -> None:
    model = script(
        tmp_path / "b.yaml",
        [
            {"tool_calls": [{"name": "ask_human", "arguments": {"question": "Which colour?"}}]},
            {"content": "painted it {last_tool}"},
        ],
    )
    lines = [{"id": "ask", "task": "paint the roof"}]
    batch = tmp_path / "tasks.jsonl"
    batch.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out = tmp_path / "results.jsonl"
    result = cli(url, workspace, "batch", str(batch), "--out", str(out), "--model", model)
    assert result.returncode == 1, result.stderr  # not every task completed
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["status"], row["question"]) == ("waiting", "Which colour?")
    assert fleet.reply(row["trace_id"], "red").wait(timeout_s=TIMEOUT_S).answer == "painted it red"


def test_a_wall_time_budget_ends_a_wait_on_a_person(fleet: Fleet, tmp_path: Path) -> None:
    from fleet.limits.budget import Budget

    handle = fleet.submit("paint the porch", model=ask_script(tmp_path), budget=Budget(wall_s=2))
    wait_until(lambda: bool(fleet.waiting()), TIMEOUT_S, "the question")
    assert waiting_on(fleet.trace(handle.trace_id))["ends"] == "budget"  # type: ignore[index]
    done = handle.wait(timeout_s=TIMEOUT_S)  # a sweeper ends the wait when wall_s runs out
    assert done.status == "completed" and done.run.stop_reason == "budget", done
    person = fleet.store.collaborators(done.trace_id)[0]
    assert person.status == "failed" and "time budget" in person.summary
