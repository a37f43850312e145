"""FLEET_CELERY_PATCHES_OFF: a patch switched off leaves Celery's or kombu's behaviour in place.

The switch is applied where the app is configured (`workers.app.configured`); each patch
off is exactly upstream (the replaced attribute put back, the subclass acting as its base),
and a fleet with every patch off still runs an explore to the end on Celery's own join.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.app import trace as celery_trace
from celery.backends.redis import RedisBackend, SentinelBackend
from celery.utils.saferepr import saferepr
from kombu.connection import Connection
from kombu.messaging import Producer
from kombu.transport.redis import Channel as RedisChannel
from kombu.transport.redis import QoS

from fleet.errors import ConfigError
from tests.fleetkit import celery_fleet, explore_script
from workers import patches
from workers.dispatch import join_size
from workers.events import RedactingDispatcher
from workers.patches import chord_join, kombu_redis, result_backend, switches
from workers.patches.chords import templates_apply

ROOT = Path(__file__).resolve().parent.parent

REPLACED = (
    (QoS, "append"),
    (QoS, "ack"),
    (QoS, "reject"),
    (QoS, "restore_unacked"),
    (RedisChannel, "conn_or_acquire"),
    (Producer, "maybe_declare"),
    (celery_trace, "saferepr"),
)
"""Every attribute a process-wide patch replaces."""


@pytest.fixture
def restore() -> Iterator[None]:
    """Every patch on again after the test, as a process without the variable has them."""
    yield
    patches.configure(())


def current() -> list[Any]:
    return [getattr(owner, name) for owner, name in REPLACED]


def test_every_patch_has_one_name_and_the_globals_are_among_them() -> None:
    assert set(patches.GLOBAL_INSTALLS) <= set(switches.PATCHES)
    assert list(kombu_redis.INSTALLS) == [n for n in switches.PATCHES if n.startswith("kombu-")]


def test_an_unknown_name_is_one_line_naming_the_variable_and_the_names(restore: None) -> None:
    with pytest.raises(ConfigError) as error:
        patches.configure(["fleet-join", "no-such-patch"])
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("FLEET_CELERY_PATCHES_OFF: unknown patch 'no-such-patch'")
    assert "kombu-broker-loss" in message and "all" in message
    assert switches.enabled("fleet-join"), "a wrong list changes nothing"


def test_all_off_puts_back_exactly_what_celery_and_kombu_had(restore: None) -> None:
    patches.configure(["all"])
    upstream = current()
    assert patches.installed() == ()
    assert celery_trace.saferepr is saferepr
    assert all(f.__module__.split(".")[0] in ("kombu", "celery") for f in upstream[:-1])
    assert not any(switches.enabled(name) for name in switches.PATCHES)
    patches.configure(())
    assert patches.installed() == tuple(patches.GLOBAL_INSTALLS)
    assert all(now is not before for now, before in zip(current(), upstream, strict=True))
    patches.configure(["ALL"])
    assert current() == upstream


def test_one_patch_off_leaves_the_others_on(restore: None) -> None:
    patches.configure(())
    patched_ack = QoS.ack
    patches.configure(["kombu-pool-client"])
    assert RedisChannel.conn_or_acquire.__module__ == "kombu.transport.redis"
    assert QoS.ack.__module__ == "workers.patches.kombu_redis"
    assert QoS.ack is not patched_ack, "re-installed over the restored original"
    assert "kombu-pool-client" not in patches.installed()
    assert switches.enabled("fleet-join") and not switches.enabled("kombu-pool-client")


def test_the_backend_class_is_celerys_with_both_backend_patches_off(restore: None) -> None:
    patches.configure(["send-only-results"])
    assert result_backend.fleet_class(RedisBackend) is result_backend.SendOnlyRedisBackend
    patches.configure(["send-only-results", "fleet-join"])
    assert result_backend.fleet_class(RedisBackend) is RedisBackend
    assert result_backend.fleet_class(SentinelBackend) is SentinelBackend


def test_with_the_join_off_a_chord_body_carries_no_size(restore: None) -> None:
    assert join_size(3) == {chord_join.SIZE_OPTION: 3}
    patches.configure(["fleet-join"])
    assert join_size(3) == {}


def test_with_event_batching_off_the_dispatcher_keeps_celerys_buffer(restore: None) -> None:
    app = Celery("switches", broker="memory://", set_as_current=False)
    assert RedactingDispatcher(app=app, enabled=False).buffer_limit == 100
    patches.configure(["event-batching"])
    dispatcher = RedactingDispatcher(app=app, enabled=False)
    assert dispatcher.buffer_limit == 24 and not dispatcher.batching


@pytest.mark.integration
def test_with_header_template_off_no_header_comes_from_a_template(
    redis_url: str, restore: None
) -> None:
    with Connection(redis_url) as conn:
        producer = Producer(conn.default_channel)
        with producer.batch(4):
            assert templates_apply(producer)
            patches.configure(["header-template"])
            assert not templates_apply(producer)


def configure_in_a_fresh_interpreter(off: str | None) -> subprocess.CompletedProcess[str]:
    code = (
        "from workers import patches\n"
        "from workers.app import app\n"
        "print(len(patches.installed()))\n"  # importing installs nothing
        "app.conf.broker_url\n"  # the first use of the configuration configures
        "print(','.join(patches.installed()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != switches.ENV_NAME}
    if off is not None:
        env[switches.ENV_NAME] = off
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )


def test_the_variable_is_applied_where_the_app_is_configured() -> None:
    default = configure_in_a_fresh_interpreter(None)
    assert default.stdout.split() == ["0", ",".join(patches.GLOBAL_INSTALLS)], default.stderr
    off = configure_in_a_fresh_interpreter("kombu-broker-loss, event-repr")
    rest = [n for n in patches.GLOBAL_INSTALLS if n not in ("kombu-broker-loss", "event-repr")]
    assert off.stdout.split() == ["0", ",".join(rest)], off.stderr
    wrong = configure_in_a_fresh_interpreter("fleet-jion")
    assert wrong.returncode != 0
    assert "FLEET_CELERY_PATCHES_OFF: unknown patch 'fleet-jion'" in wrong.stderr


@pytest.mark.integration
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_fleet_with_every_patch_off_runs_an_explore_on_celerys_join(
    redis_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore: None,
) -> None:
    patches.configure(["all"])
    env = {switches.ENV_NAME: "all"}
    with celery_fleet(redis_url, tmp_path, monkeypatch, concurrency=8, **env) as fleet:
        model = explore_script(tmp_path / "m.yaml", 6)
        trace = fleet.submit("survey", model=model).wait(timeout_s=60)
        assert trace.status == "completed", trace.error
        statuses = [c.status for c in fleet.store.collaborators(trace.trace_id)]
        assert statuses == ["completed"] * 6
        tool_results = [m for m in fleet.store.messages(trace.trace_id) if m.role == "tool"]
        assert len(tool_results) == 1 and "6 branches, 6 completed" in (
            tool_results[0].content or ""
        )
    marks = list(redis_client.scan_iter("celery-taskset-meta-*"))
    fleet_keys = (chord_join.CLAIM_SUFFIX, chord_join.PARTS_SUFFIX)
    assert not [k for k in marks if k.endswith(fleet_keys)], "no key of the fleet's join"
    assert [k for k in marks if k.endswith(".c")], "Celery's join marked the chord done"
    # Celery's own backend subscribed to results in the worker's threads (send-only-results
    # off): its sockets go with the threads' backends, collected here under this test's filter.
    gc.collect()
