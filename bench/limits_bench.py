"""Provider limits, tree budgets and fair sharing at full size, with their baselines.

python bench/limits_bench.py [--only overhead,requests,tokens,fairness,exact] [--branches 200]
                             [--rate 20] [--workers 2] [--concurrency 50] [--runs 3]

Starts its own redis-server, a local OpenAI-wire server that enforces its own limit (429 +
retry-after-ms beyond it: tests/fake_provider.py) and worker processes, then reports:

- overhead: the gate's cost per model call (round trips, commands and microseconds of
  `Gate.before` + `Gate.sending` + `Gate.after`) on each path: no provider, a provider
  without `limits:` (its pause check only), a limited one (admit + send + settle), each with
  and without a budget.
- requests: an explore of N branches against a server limited to R requests/s, once with
  the same limit in fleet.yaml and once without (each worker backs off its own 429s, as
  before): branches completed, share of 429s, wall time against the limit-bound minimum.
- tokens: the same with the server limited by tokens/s and large completions.
- fairness: a 3-branch interactive tree alone, then beside a big batch tree; the ratio.
- exact: an explore of `--exact-branches` (120) branches of two calls each, through real
  workers, against a server that allows exactly R requests in ANY rolling second (no burst)
  and answers 429 with `retry-after` in seconds, with `requests_per_minute: 60 R` in
  fleet.yaml: completions, 429s, the longest gap between two requests, wall time against
  the limit-bound time (requests / R), `--runs` times.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import yaml
from redis.connection import AbstractConnection

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleet.client import Fleet  # noqa: E402
from fleet.limits.backends.redis.budgets import Budgets  # noqa: E402
from fleet.limits.backends.redis.limiter import Limiter  # noqa: E402
from fleet.limits.budget import Budget  # noqa: E402
from fleet.limits.gate import Gate, Go  # noqa: E402
from fleet.llm.base import LLMResponse, Usage  # noqa: E402
from fleet.llm.config import FleetConfig, ProviderConfig, RateLimits  # noqa: E402
from fleet.models import Trace  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleet.testing import Script  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.fake_provider import RateLimitedProvider, Stats  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402
from tests.procs import WorkerProcess, start_worker, wait_for_workers  # noqa: E402

CALLS = 5000


def overhead(url: str) -> None:
    """Round trips, commands and microseconds per model call through `Gate.before/after`."""
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    huge = RateLimits(requests_per_minute=10**9)
    config = FleetConfig(
        providers={
            "plain": ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1"),
            "paced": ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1", limits=huge),
        }
    )
    gate = Gate(config, {}, Limiter(client), Budgets(client))
    assert gate.budgets is not None
    gate.budgets.create("budgeted", Budget(tokens=10**12))
    rows = [
        ("scripted model (no provider)", "scripted:x", "free", 0),
        ("provider without limits: (pause check)", "plain:m", "free", 1),
        ("  + tree budget (check in the reservation)", "plain:m", "budgeted", 2),
        ("requests/min limit (admit + send + settle)", "paced:m", "free", 3),
        ("  + tree budget", "paced:m", "budgeted", 5),
    ]
    print(
        "\n## Overhead per model call through Gate.before + Gate.sending + Gate.after "
        "(one thread, local Redis)"
    )
    print("# wall: client-side us per call; lua: us Redis spent in scripts per call")
    print(f"{'path':<44} {'round trips':>11} {'commands':>8} {'wall us':>9} {'lua us':>8}")
    ping = _per_call(client, lambda i: client.ping())
    print(f"{'reference: one PING':<44} {ping[0]:>5.1f}       {ping[1]:>8.1f} {ping[2]:>9.1f}")
    for name, model, root, trips in rows:

        def step(i: int, model: str = model, root: str = root) -> None:
            trace = Trace(trace_id=f"{root}@explore-{i % 100:03d}", root_trace_id=root, task="x")
            go = gate.before(trace, model, 4000)
            assert isinstance(go, Go), go
            assert gate.sending(go) is None
            gate.after(go, LLMResponse("x", usage=Usage(10, 10)), 5)

        step(0)  # loads the scripts, learns whether the tree has a budget
        seen, cmds, us, lua = _per_call(client, step)
        print(f"{name:<44} {seen:>5.1f} ({trips})  {cmds:>8.1f} {us:>9.1f} {lua:>8.1f}")


def _per_call(client: redis.Redis, step: Any) -> tuple[float, float, float, float]:
    """Round trips, commands, wall us and Lua us per call of `step`, over CALLS calls."""
    calls_before, usec_before = _evalsha(client)
    commands_before = _commands(client)
    trips_before = _TRIPS[0]
    started = time.perf_counter()
    for i in range(CALLS):
        step(i)
    us = (time.perf_counter() - started) / CALLS * 1e6
    trips = (_TRIPS[0] - trips_before) / CALLS
    commands = (_commands(client) - commands_before) / CALLS
    _calls_after, usec_after = _evalsha(client)
    return trips, commands, us, (usec_after - usec_before) / CALLS


_TRIPS = [0]
_send = AbstractConnection.send_packed_command


def _counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
    """Count round trips: one packed send per command or pipeline."""
    _TRIPS[0] += 1
    _send(self, *args, **kwargs)  # type: ignore[no-untyped-call]


AbstractConnection.send_packed_command = _counted  # type: ignore[method-assign]


def _commands(client: redis.Redis) -> int:
    """Commands run so far (INFO itself excluded; commands inside scripts included)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def _evalsha(client: redis.Redis) -> tuple[int, int]:
    """Script calls so far, and the microseconds Redis spent in them."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


@dataclass
class Run:
    label: str
    branches: int
    completed: int
    answered: int
    refused: int
    elapsed_s: float
    bound_s: float

    def line(self) -> str:
        share = self.refused / max(1, self.answered + self.refused)
        ratio = self.elapsed_s / self.bound_s if self.bound_s else float("nan")
        return (
            f"{self.label:<34} {self.completed:>4}/{self.branches:<4} {share:>7.1%} "
            f"{self.elapsed_s:>8.1f} {self.bound_s:>8.1f} {ratio:>6.2f}x"
        )


HEADER = f"{'run':<34} {'done':>9} {'429s':>7} {'wall s':>8} {'bound s':>8} {'ratio':>7}"


@contextlib.contextmanager
def fleet_on(
    url: str, tmp: Path, providers: dict[str, Any], models: dict[str, Any], args: Any
) -> Iterator[Fleet]:
    """Workers (fresh, so they read this fleet.yaml) and a client."""
    config = tmp / f"fleet-{time.monotonic_ns()}.yaml"
    config.write_text(yaml.safe_dump({"providers": providers, "models": models}))
    workspace = tmp / "workspace"
    workspace.mkdir(exist_ok=True)
    env = {
        "FLEET_CONFIG": str(config),
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
        "FLEET_ALLOW_SCRIPTED": "1",
    }
    with contextlib.ExitStack() as stack:
        procs: list[WorkerProcess] = [
            stack.enter_context(start_worker(url, concurrency=args.concurrency, env_extra=env))
            for _ in range(args.workers)
        ]
        wait_for_workers(url, [p.name for p in procs], timeout_s=60)
        settings = Settings.from_env({"FLEET_REDIS_URL": url, **env})
        fleet = Fleet.from_env(settings)
        yield fleet


def brain(tmp: Path, branches: int) -> Script:
    model = explore_script(tmp / f"brain-{branches}.yaml", branches, branch_turns=0)
    path = model.removeprefix("scripted:")
    return Script.parse(yaml.safe_load(Path(path).read_text()), path)


def elapsed(trace: Trace) -> float:
    return ((trace.finished_at_ms or 0) - trace.created_at_ms) / 1000


def explore_run(
    fleet: Fleet, model: str, label: str, server: RateLimitedProvider, bound: Any
) -> Run:
    server.stats.reset()
    trace = fleet.submit("survey", model=model).wait(timeout_s=1800)
    done = sum(c.status == "completed" for c in fleet.store.collaborators(trace.trace_id))
    kids = len(fleet.store.children(trace.trace_id))
    stats = server.stats
    return Run(label, kids, done, stats.answered, stats.refused, elapsed(trace), bound(stats))


def requests_runs(url: str, tmp: Path, args: Any) -> None:
    n, rate = args.branches, args.rate
    print(
        f"\n## {n} branches, server limited to {rate:g} requests/s "
        f"({args.workers} workers x {args.concurrency} threads)"
    )
    print(HEADER)
    with RateLimitedProvider(brain(tmp, n), requests_per_s=rate, latency_s=0.05) as server:
        base = f"{server.url}/v1"
        limited = {
            "kind": "openai",
            "base_url": base,
            "limits": {"requests_per_minute": int(rate * 60)},
        }
        for label, provider in (
            ("same limit in fleet.yaml", limited),
            ("no limits: (429s pause the fleet)", {"kind": "openai", "base_url": base}),
        ):
            with fleet_on(url, tmp, {"fake": provider}, {}, args) as fleet:
                run = explore_run(fleet, "fake:m", label, server, lambda s: (s.answered) / rate)
                print(run.line(), flush=True)


def tokens_runs(url: str, tmp: Path, args: Any) -> None:
    n, tokens_s, completion = args.branches, args.tokens_rate, 2000
    print(
        f"\n## {n} branches answering {completion} tokens each, server limited to "
        f"{tokens_s:g} tokens/s"
    )
    print(HEADER)
    with RateLimitedProvider(
        brain(tmp, n), tokens_per_s=tokens_s, completion_tokens=completion, latency_s=0.05
    ) as server:
        base = f"{server.url}/v1"
        limited = {
            "kind": "openai",
            "base_url": base,
            "limits": {"tokens_per_minute": int(tokens_s * 60)},
        }
        models = {"big": {"provider": "fake", "name": "m", "max_output_tokens": completion}}
        for label, provider in (
            ("same limit in fleet.yaml", limited),
            ("no limits: (429s pause the fleet)", {"kind": "openai", "base_url": base}),
        ):
            with fleet_on(url, tmp, {"fake": provider}, models, args) as fleet:
                run = explore_run(fleet, "big", label, server, lambda s: s.tokens / tokens_s)
                print(run.line(), flush=True)


def exact_runs(url: str, tmp: Path, args: Any) -> None:
    """A limit configured at exactly what a rolling-window provider enforces."""
    n, rate = args.exact_branches, args.rate
    print(
        f"\n## {n} branches x 2 calls, server allows {rate:g} requests in any rolling second "
        f"(no burst; 429 + retry-after s), limits: {{requests_per_minute: {int(rate * 60)}}} "
        f"({args.workers} workers x {args.concurrency} threads)"
    )
    print(
        f"{'run':<6} {'answered':>8} {'429s':>5} {'429 %':>6} {'max/1s':>6} {'gap s':>6} "
        f"{'wall s':>7} {'bound s':>7} {'ratio':>6} {'<=1.25b+3':>9}"
    )
    model = explore_script(tmp / f"exact-{n}.yaml", n, branch_turns=1)
    path = model.removeprefix("scripted:")
    script = Script.parse(yaml.safe_load(Path(path).read_text()), path)
    answered = refused = 0
    with RateLimitedProvider(
        script, requests_per_s=rate, window="rolling", latency_s=0.05
    ) as server:
        limits = {"requests_per_minute": int(rate * 60)}
        limited = {"kind": "openai", "base_url": f"{server.url}/v1", "limits": limits}
        with fleet_on(url, tmp, {"fake": limited}, {}, args) as fleet:
            for i in range(args.runs):
                server.stats.reset()
                trace = fleet.submit("survey", model="fake:m").wait(timeout_s=600)
                print(exact_row(i + 1, server.stats, elapsed(trace), rate), flush=True)
                answered, refused = answered + server.stats.answered, refused + server.stats.refused
    share = refused / max(1, answered + refused)
    print(f"all runs: {refused} answered 429 of {answered + refused} requests ({share:.2%})")


def exact_row(run: int, stats: Stats, wall_s: float, rate: float) -> str:
    """One run: what the server saw, and whether it meets <= 1 % and 1.25x the bound + 3 s."""
    bound_s = stats.answered / rate
    share = stats.refused / max(1, stats.answered + stats.refused)
    held = share <= 0.01 and wall_s <= 1.25 * bound_s + 3.0
    return (
        f"{run:<6} {stats.answered:>8} {stats.refused:>5} {share:>6.1%} "
        f"{stats.max_in_window():>6} {stats.longest_gap_s():>6.2f} {wall_s:>7.1f} "
        f"{bound_s:>7.1f} {wall_s / bound_s:>5.2f}x {'yes' if held else 'NO':>9}"
    )


def fairness(url: str, tmp: Path, args: Any) -> None:
    big_n = args.big
    print(
        f"\n## A 3-branch interactive tree beside a {big_n}-branch batch tree "
        "(scripted model, 500 ms per call; batch calls 250-750 ms)"
    )
    with fleet_on(url, tmp, {}, {}, args) as fleet:
        small = explore_script(tmp / "small.yaml", 3, latency_ms=500)
        big = explore_script(tmp / "big.yaml", big_n, latency_ms=250, jitter_ms=500)
        idle = statistics.median(
            elapsed(fleet.submit("quick", model=small).wait(120)) for _ in range(3)
        )
        for priority in ("batch", "interactive"):
            tree = fleet.submit("big survey", model=big, priority=priority)
            while len(fleet.store.children(tree.trace_id)) < big_n:
                time.sleep(0.1)
            time.sleep(1.0)
            busy = [elapsed(fleet.submit("quick", model=small).wait(600)) for _ in range(3)]
            kids = [fleet.trace(c) for c in fleet.store.children(tree.trace_id)]
            ended = sum(k.is_terminal for k in kids)
            label = "big tree at batch priority" if priority == "batch" else "big tree, no priority"
            mid = statistics.median(busy)
            print(
                f"{label:<30} idle {idle:5.2f} s  beside it {mid:6.2f} s  ratio {mid / idle:5.2f}x"
                f"  (big tree: {ended}/{big_n} branches ended by then)"
            )
            fleet.stop(tree.trace_id)
            time.sleep(2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", default="overhead,requests,tokens,fairness")
    parser.add_argument("--branches", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s of the server")
    parser.add_argument("--tokens-rate", type=float, default=40_000.0, help="tokens/s")
    parser.add_argument("--big", type=int, default=1000, help="branches of the batch tree")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--exact-branches", type=int, default=120)
    parser.add_argument("--runs", type=int, default=3, help="runs of the exact mode")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    with start_redis_server() as server, tempfile.TemporaryDirectory(prefix="limits-") as tmp:
        if "overhead" in parts:
            overhead(server.url)
        if "requests" in parts:
            requests_runs(server.url, Path(tmp), args)
        if "tokens" in parts:
            tokens_runs(server.url, Path(tmp), args)
        if "fairness" in parts:
            fairness(server.url, Path(tmp), args)
        if "exact" in parts:
            exact_runs(server.url, Path(tmp), args)


if __name__ == "__main__":
    main()
