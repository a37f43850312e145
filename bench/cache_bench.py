"""Prompt caching and `warm_explore`: the latency it costs, the tokens and dollars it saves.

python bench/cache_bench.py [--sizes 5,10] [--latency-ms 300] [--repeat 3] [--quick]

An explore of N branches (each branch: list_dir, then an answer; the root: the `agent`
call, then its answer) runs in this process (`InProcessFleet`, one thread per branch)
against `tests.fake_cache_provider.CachingProvider`, a local server that keeps a prompt
cache as the providers do (a prefix is readable only once the call that wrote it has
answered; OpenAI caches every prefix per `prompt_cache_key`, Anthropic only up to its
`cache_control` breakpoints) and answers each call after `--latency-ms`. For each wire
(openai: gpt-4o-mini prices; anthropic: claude-haiku-4-5 prices) and each N, the two
configurations run side by side, alternating, R times each:

- `off`: `warm_explore: false`, every branch calls at once;
- `warm`: `warm_explore: true`, the other branches wait for the first branch's first call.

Printed per cell: median wall time of the whole tree, prompt tokens, those read from the
cache and written to it, and the tree's cost (`TraceStats`, summed over the tree); then
`warm/off` ratios. The provider's counts are checked against the fleet's stats each run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import fleet.llm.base  # noqa: E402
from bench.report import machine  # noqa: E402
from fleet.inprocess import InProcessDispatcher, InProcessFleet  # noqa: E402
from fleet.llm.anthropic import AnthropicClient  # noqa: E402
from fleet.llm.openai import OpenAIClient  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.testing import Script  # noqa: E402
from tests.fake_cache_provider import CachingProvider  # noqa: E402

MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}


@dataclass(frozen=True)
class Sample:
    wall_s: float
    prompt: int
    cached: int
    written: int
    cost_usd: float


def script(branches: int) -> Script:
    look = {"tool_calls": [{"name": "list_dir", "arguments": {"path": "."}}]}
    tasks = [f"Branch {i} of the survey" for i in range(1, branches + 1)]
    spawn = {"tool_calls": [{"name": "agent", "arguments": {"task": tasks}}]}
    return Script.parse(
        {
            "scripts": [
                {"match": "^Branch", "steps": [look, {"content": "done: {task}"}]},
                {"match": ".*", "steps": [spawn, {"content": "all done"}]},
            ]
        },
        "cache-bench",
    )


def one_run(folder: Path, kind: str, url: str, branches: int, warm: bool) -> Sample:
    base = f"{url}/v1" if kind == "openai" else url
    config = {
        "providers": {"cache": {"kind": kind, "base_url": base}},
        "models": {"m": {"provider": "cache", "name": MODELS[kind]}},
        "warm_explore": warm,
    }
    path = folder / f"fleet-{kind}-{warm}.yaml"
    path.write_text(yaml.safe_dump(config))
    (workspace := folder / "workspace").mkdir(exist_ok=True)
    settings = Settings(workspace=workspace, env={}, config_path=path)
    inline = InProcessFleet.from_settings(
        settings, dispatcher=InProcessDispatcher(max_parallel=branches)
    )
    started = time.perf_counter()
    root = inline.run("survey the workspace", model="m")
    wall_s = time.perf_counter() - started
    assert root.status == "completed", root.error
    tree = [
        root,
        *(inline.store.get_trace(c.trace_id) for c in inline.store.collaborators(root.trace_id)),
    ]
    for client in inline.runtime.clients.values():
        if isinstance(client, OpenAIClient | AnthropicClient):
            client.close()
    return Sample(
        wall_s,
        sum(t.stats.prompt_tokens for t in tree),
        sum(t.stats.cached_tokens for t in tree),
        sum(t.stats.cache_write_tokens for t in tree),
        sum(t.stats.cost_usd for t in tree),
    )


def cell(kind: str, branches: int, latency_s: float, repeat: int) -> dict[bool, list[Sample]]:
    """R runs of each configuration, alternating, each on a fresh provider (a cold cache)."""
    samples: dict[bool, list[Sample]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="cache-bench-") as tmp:
        for round_ in range(repeat):
            for warm in (False, True) if round_ % 2 == 0 else (True, False):
                with CachingProvider(script(branches), latency_s=latency_s) as server:
                    sample = one_run(Path(tmp), kind, server.url, branches, warm)
                    assert sample.cached == server.stats.cached_tokens
                    assert sample.prompt == server.stats.prompt_tokens
                samples[warm].append(sample)
    return samples


def median(samples: list[Sample], field: str) -> float:
    return statistics.median(getattr(s, field) for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5,10")
    parser.add_argument("--latency-ms", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one size (5), one run each")
    args = parser.parse_args()
    sizes = [5] if args.quick else [int(n) for n in args.sizes.split(",")]
    repeat = 1 if args.quick else args.repeat
    fleet.llm.base.ALLOW_MODEL_REQUESTS = True  # the provider is on loopback
    print(f"# cache_bench: {machine()}; model latency {args.latency_ms} ms; median of {repeat}")
    head = "wire       N  mode   wall s  prompt tok  cached  written   cost $"
    print(head)
    ratios = []
    for kind in ("openai", "anthropic"):
        for n in sizes:
            samples = cell(kind, n, args.latency_ms / 1000, repeat)
            for warm in (False, True):
                got = samples[warm]
                print(
                    f"{kind:9} {n:3}  {'warm' if warm else 'off ':5} {median(got, 'wall_s'):7.2f}"
                    f" {median(got, 'prompt'):11.0f} {median(got, 'cached'):7.0f}"
                    f" {median(got, 'written'):8.0f} {median(got, 'cost_usd'):9.6f}"
                )
            off, on = samples[False], samples[True]
            ratios.append(
                (kind, n, median(on, "wall_s") / median(off, "wall_s"),
                 median(on, "cached") - median(off, "cached"),
                 median(on, "cost_usd") / median(off, "cost_usd"))
            )  # fmt: skip
    print("\nwire       N  wall warm/off  extra cached tok  cost warm/off")
    for kind, n, wall, saved, cost in ratios:
        print(f"{kind:9} {n:3}  {wall:13.2f}  {saved:16.0f}  {cost:13.3f}")


if __name__ == "__main__":
    main()
