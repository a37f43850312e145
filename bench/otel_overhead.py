"""What the OpenTelemetry hooks cost a run, in one process: off vs on, side by side.

python bench/otel_overhead.py [--branches 50] [--repeat 9]

Each cell is the median wall time of an inline explore (a main agent exploring N branches,
each branch list_dir then an answer; scripted model, no latency; in-memory store) with:
- `off`: the no-op hooks (what a worker runs without OTEL_* variables),
- `on`: OtelHooks into the SDK with a BatchSpanProcessor and an exporter that drops spans
  (the span work in the agent loop, without the network),
- `on+content`: the same with the capture-content opt-in.
Runs alternate (off, on, on+content, off, ...) so drift hits all three alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet.conversation.roots import TaskSpec, create_root  # noqa: E402
from fleet.inprocess import InProcessDispatcher  # noqa: E402
from fleet.loop.runner import Runner  # noqa: E402
from fleet.observe.hooks import NO_HOOKS, Hooks  # noqa: E402
from fleet.observe.otel_spans import OtelHooks  # noqa: E402
from fleet.runtime import Runtime  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.storage.backends.memory.store import MemoryStore  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402


class Drop(SpanExporter):
    """Counts spans and drops them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def one_run(workdir: Path, model: str, mode: str, exporter: Drop) -> float:
    store = MemoryStore()
    hooks: Hooks = NO_HOOKS
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    if mode != "off":
        hooks = OtelHooks(store, provider.get_tracer("bench"), capture_content=mode == "on+content")
    settings = Settings(workspace=workdir, allow_scripted=True)
    runtime = Runtime.build(settings, store, InProcessDispatcher(), hooks=hooks)
    root = create_root(runtime, TaskSpec("survey", model))
    started = time.perf_counter()
    Runner(runtime).run(root.trace_id)
    elapsed = time.perf_counter() - started
    provider.shutdown()  # exports what the batch holds, outside the timed part
    assert store.get_trace(root.trace_id).status == "completed"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    modes = ("off", "on", "on+content")
    times: dict[str, list[float]] = {m: [] for m in modes}
    exporter = Drop()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        model = explore_script(workdir / "model.yaml", args.branches)
        one_run(workdir, model, "off", exporter)  # warm-up: imports, caches
        for _ in range(args.repeat):
            for mode in modes:
                times[mode].append(one_run(workdir, model, mode, exporter))
    base = statistics.median(times["off"])
    calls = 2 + 2 * args.branches
    print(
        f"inline explore, {args.branches} branches ({calls} model calls), median of {args.repeat}"
    )
    for mode in modes:
        median = statistics.median(times[mode])
        print(f"{mode:>11}: {median * 1000:8.1f} ms  ratio {median / base:5.2f}")
    per_run = exporter.spans // (2 * args.repeat)
    print(f"spans exported (then dropped): {exporter.spans}, {per_run} a traced run")


if __name__ == "__main__":
    main()
