"""A remote child's message is sent once: recorded through an outage, never by a lost runner.

make chaos, seed 40 round 24 (a Redis restart beside a `remote` tree): a run that sent
its A2A message and then met the store away was interrupted before it recorded the send,
and its next run sent the message again, a second task at an agent that keeps no message
ids (counted *doubled*). The record is now tried again while the store comes back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from fleet.errors import LeaseLost
from fleet.inprocess import InProcessDispatcher
from fleet.lifecycle.remote import RemoteCall
from fleet.loop.runner import Runner, run_safely
from fleet.models import Message, Trace
from fleet.remote.run import run_remote
from fleet.runstate import RunState
from fleet.runtime import Runtime
from fleet.settings import Settings
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel, text
from tests.a2a_agent import serve_reviewer
from tests.conftest import fake_redis
from tests.fleetkit import wait_until

pytestmark = pytest.mark.timeout(90)


class Parking(InProcessDispatcher):
    """As on a task queue: the watch list's pollers follow the remote task, not the run."""

    children_survive_restart = True


def test_a_send_whose_record_meets_the_store_away_is_sent_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "conf" / "fleet.yaml"
    config.parent.mkdir()
    (tmp_path / "ws").mkdir()
    store = RedisStore(fake_redis())
    away = {"left": 1}  # the store answers again at the second try
    update_run = RedisStore.update_run

    def flaky(self: RedisStore, trace_id: str, **fields: Any) -> None:
        if "remote_call" in fields and fields["remote_call"].state == "sent" and away["left"]:
            away["left"] -= 1
            raise redis.ConnectionError("Connection refused (a Redis restart)")
        update_run(self, trace_id, **fields)

    monkeypatch.setattr(RedisStore, "update_run", flaky)
    with serve_reviewer() as agent:
        config.write_text(
            yaml.safe_dump({"remote_agents": {"reviewer": {"url": agent.url, "private": True}}})
        )
        settings = Settings(
            workspace=tmp_path / "ws", env={}, config_path=config, remote_poll_s=0.05
        )
        runtime = Runtime.build(
            settings, store, Parking(), clients={"m": ScriptedModel([text("x")])}
        )
        store.create_trace(Trace(trace_id="r", root_trace_id="r", task="review", status="waiting"))
        child = remote_child()
        store.create_trace(child)
        outcomes = [run_safely(Runner(runtime), child.trace_id).outcome]
        if outcomes[0] != "parked":  # interrupted: its lease lapses, a sweeper's run goes on
            wait_until(lambda: store.lease_holder(child.trace_id) is None, 30, "the lease to lapse")
            outcomes.append(run_safely(Runner(runtime), child.trace_id).outcome)
        sent = list(agent.record.messages)

    assert [text for _, _, text in sent] == ["slow 5 look"], "one task, not two"
    assert outcomes == ["parked"]
    call = store.get_trace(child.trace_id).run.remote_call
    assert call is not None and (call.state, call.task_id) == ("sent", sent[0][0])


def test_a_runner_that_lost_its_lease_before_the_send_sends_nothing(tmp_path: Path) -> None:
    # make chaos seed 44 round 13: a worker froze in a remote child's run past its lease;
    # the recovered run sent the task, and the thawed one sent it again before its record
    # was fenced out: a second task.
    config = tmp_path / "conf" / "fleet.yaml"
    config.parent.mkdir()
    (tmp_path / "ws").mkdir()
    store = RedisStore(fake_redis())
    with serve_reviewer() as agent:
        entry = {"url": agent.url, "private": True}
        config.write_text(yaml.safe_dump({"remote_agents": {"reviewer": entry}}))
        settings = Settings(workspace=tmp_path / "ws", env={}, config_path=config)
        runtime = Runtime.build(settings, store, Parking(), clients={"m": ScriptedModel()})
        child = remote_child(status="running")
        store.create_trace(child)
        store.append_message(Message(trace_id=child.trace_id, role="user", content="slow 5 look"))
        assert store.acquire_lease(child.trace_id, "the-recovered-run", 60_000)
        thawed = runtime.fenced(child.trace_id, "the-frozen-run")

        with pytest.raises(LeaseLost):
            run_remote(thawed, child, park=True)
        sent = list(agent.record.messages)

    assert sent == [], "the recovered run sends it, not this one"


def remote_child(**fields: Any) -> Trace:
    """Root `r`'s remote child `r@remote-1` asking the `reviewer` agent for `slow 5 look`."""
    return Trace.model_validate(
        {
            "trace_id": "r@remote-1",
            "root_trace_id": "r",
            "parent_trace_id": "r",
            "parent_tool_call_id": "c1",
            "task": "slow 5 look",
            "mode": "remote",
            "run": RunState(remote_call=RemoteCall(agent="reviewer")),
            **fields,
        }
    )
