"""OpenTelemetry across real worker processes: one distributed trace per tree.

The workers export over OTLP/HTTP, configured only by the standard OTEL_* variables, to a
receiver this test runs; the root runs on one worker and the branches on another.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tests.fleetkit import client, explore_script, fleet_settings, wait_until
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.procs import start_worker, wait_for_workers

pytestmark = pytest.mark.integration
BRANCHES = 3


def otel_env(receiver: OtlpReceiver, role: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "fleet-test",
        "OTEL_RESOURCE_ATTRIBUTES": f"fleet.worker.role={role}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


def named(spans: list[ReceivedSpan], prefix: str, trace_id: str) -> list[ReceivedSpan]:
    return [
        s for s in spans if s.name.startswith(prefix) and s.attributes["fleet.trace_id"] == trace_id
    ]


def test_an_explore_on_two_workers_is_one_trace_parented_across_machines(
    redis_url: str, tmp_path: Path
) -> None:
    with redis.Redis.from_url(redis_url) as admin:
        admin.flushdb()
    fleet = client(fleet_settings(redis_url, tmp_path))
    model = explore_script(tmp_path / "model.yaml", BRANCHES, branch_turns=1)
    with (
        OtlpReceiver() as receiver,
        start_worker(
            redis_url, queues=["fleet.main"], env_extra=otel_env(receiver, "main")
        ) as main,
        start_worker(
            redis_url, queues=["fleet.explore"], env_extra=otel_env(receiver, "explore")
        ) as br,
    ):
        wait_for_workers(redis_url, [main.name, br.name], timeout_s=30)
        root = fleet.submit("survey the repo", model=model).wait(timeout_s=60)
        # Root: 2 runs (before and after its branches), 2 model calls; branches: 1 run, 2 calls.
        expected_runs, expected_chats = 2 + BRANCHES, 2 + 2 * BRANCHES

        def exported() -> bool:
            spans = receiver.spans()
            runs = [s for s in spans if s.name.startswith("invoke_agent")]
            chats = [s for s in spans if s.name.startswith("chat ")]
            return len(runs) == expected_runs and len(chats) == expected_chats

        wait_until(exported, 30, "every run and model call to be exported")
    assert root.status == "completed"
    spans = receiver.spans()
    assert {s.trace_id for s in spans} == {spans[0].trace_id}  # one trace, both machines
    first, resumed = named(spans, "invoke_agent main", root.trace_id)
    assert resumed.parent_span_id == first.span_id  # the resumed parent continues the trace
    (agent_call,) = named(spans, "execute_tool agent", root.trace_id)
    assert agent_call.parent_span_id == first.span_id
    assert agent_call.attributes["gen_ai.tool.name"] == "agent"
    children = fleet.store.children(root.trace_id)
    assert len(children) == BRANCHES
    for child in children:
        (run,) = named(spans, "invoke_agent explore-", child)
        assert run.parent_span_id == agent_call.span_id  # parented across processes
        assert run.resource["fleet.worker.role"] == "explore"
        assert run.attributes["fleet.root_trace_id"] == root.trace_id
        assert run.attributes["fleet.mode"] == "explore"
        assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert first.resource["fleet.worker.role"] == "main"
    assert first.resource["service.name"] == "fleet-test"
    for trace_id in [root.trace_id, *children]:
        stats = fleet.trace(trace_id).stats
        chats = named(spans, "chat ", trace_id)
        runs = named(spans, "invoke_agent", trace_id)
        for key, total in (
            ("gen_ai.usage.input_tokens", stats.prompt_tokens),
            ("gen_ai.usage.output_tokens", stats.completion_tokens),
        ):
            assert sum(c.attributes[key] for c in chats) == total > 0
            assert sum(r.attributes[key] for r in runs) == total
        assert {c.attributes["gen_ai.request.model"] for c in chats} == {model}
