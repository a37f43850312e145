"""A stop of a tree whose call waits in a provider batch cancels that batch at once.

On a real worker, Redis and the OpenAI Batch fake, with the poll interval left long
(300 s, its claim held by the test): only the stop's wake (`keys.batch_wake()`, heard by
the worker's `BatchWaker`) can cancel the batch within the test's seconds. A batch that
also holds another tree's call goes on.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import yaml

from fleet.batchapi.poller import poll_once
from fleet.batchapi.providers import provider_for
from fleet.llm import base as llm_base
from fleet.storage import keys
from fleet.storage.batch_calls import batch_calls
from fleet.storage.store import TraceStore
from fleet.testing import Script
from tests.fake_batch import OpenAIBatchServer
from tests.fleetkit import client, explore_script, fleet_settings, wait_until
from tests.procs import start_worker, wait_for_workers

pytestmark = pytest.mark.timeout(240)

LONG_POLL = {"FLEET_BATCH_POLL_S": "300", "FLEET_BATCH_FLUSH_S": "0.01"}
CANCEL_WITHIN_S = 15.0
"""Generous under load; the poll would take up to 300 s."""


def test_wakes_before_a_wait_are_one_wake_and_a_wait_without_one_times_out(
    store: TraceStore,
) -> None:
    calls = batch_calls(store)
    for _ in range(3):  # three stops before the waker looked: one pass answers them all
        calls.wake()
    assert calls.woken(1.0)
    began = time.monotonic()
    assert not calls.woken(0.2)
    assert time.monotonic() - began >= 0.15


@pytest.mark.integration
def test_a_stop_cancels_its_provider_batch_at_once_not_at_the_next_poll(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm_base, "ALLOW_MODEL_REQUESTS", True)  # the flush: loopback
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    path = explore_script(tmp_path / "brain.yaml", 2).removeprefix("scripted:")
    script = Script.parse(yaml.safe_load(Path(path).read_text()), path)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with OpenAIBatchServer(script, delay_s=600) as provider:
        config = tmp_path / "fleet.yaml"
        batch = {"kind": "openai", "base_url": f"{provider.url}/v1", "batch_api": True}
        models = {"slow": {"provider": "slow", "name": "fake-model"}}
        config.write_text(yaml.safe_dump({"providers": {"slow": batch}, "models": models}))
        env = {
            "FLEET_CONFIG": str(config),
            "FLEET_WORKSPACE": str(workspace),
            "FLEET_WORKSPACE_ROOTS": str(workspace),
            **LONG_POLL,
        }
        fleet = client(fleet_settings(redis_url, workspace, **env))
        calls = batch_calls(fleet.store)
        assert calls.claim(keys.batch_poll(), "the test", 600_000)  # no worker polls
        with start_worker(redis_url, concurrency=4, env_extra=env) as process:
            wait_for_workers(redis_url, [process.name], timeout_s=60)
            one, other = (
                fleet.submit(f"survey {n}", model="slow", batch_api=True).trace_id
                for n in ("one", "other")
            )
            wait_until(lambda: len(calls.queued(10)) == 2, 60, "both roots' calls queued")
            providers = provider_for(fleet.runtime.config, env)
            try:  # a poll whose upload failed (a loaded machine) queues them again: poll on
                poll = poll_once(fleet.runtime, providers)
                deadline = time.monotonic() + 60
                while not poll.batches and time.monotonic() < deadline:
                    time.sleep(0.5)
                    poll = poll_once(fleet.runtime, providers)
            finally:
                providers.close()
            assert len(poll.batches) == 1 and provider.cancelled == []  # both in one batch

            fleet.stop(one)
            assert fleet.trace(one).status == "stopped"
            time.sleep(2.0)  # the wake came; the other tree's call keeps the batch going
            assert provider.cancelled == [] and fleet.trace(other).status == "waiting"

            began = time.monotonic()
            fleet.stop(other)
            wait_until(lambda: provider.cancelled != [], CANCEL_WITHIN_S, "the batch cancelled")
            took_s = time.monotonic() - began
            assert provider.cancelled == poll.batches
            assert "batch wake failed" not in process.log()
    assert took_s < CANCEL_WITHIN_S
