"""Explore through the fleet vs plain Celery chords vs asyncio, on one machine.

python bench/explore_bench.py [--sizes 10,100,1000] [--latencies 0,200] [--http-sizes 100,500]
                              [--http-latency 200] [--pool threads] [--concurrency C]
                              [--workers W] [--repeat R] [--quick]

Starts its own redis-server, a local OpenAI-wire server (`bench.openai_server`) and worker
process(es) (the fleet's Celery app and queues, plus `bench.sleep_tasks` and
`bench.peer_tasks` via `-I`), then measures, each cell a median of R runs side by side:

- scripted rows, for each N and model latency L: the fleet (a main agent exploring N
  branches on a scripted model of L ms per call; each branch makes 2 calls, list_dir then
  an answer; the root makes 2) against `chord(N x bench.sleep(2L), bench.done)` and
  against asyncio (`ideal` = the root's two calls around a gather of the branches' two),
  and against `bench.sleep_root` (`f/same`: a plain root task making the root's two calls,
  its chord of N x sleep(2L) sent from the worker, as a Celery user would write the tree);
- HTTP rows, for each N at the HTTP latency: the same explore with the model served over
  HTTP by the local server, against `bench.http_root`, a plain chord whose tasks make the
  same completions with httpx (see bench/peer_tasks.py);
- `fleet run` of a one-completion task through the fleet and `--inline`, as processes;
- then the issue-14 target table: every target with what was measured and a verdict.

Redis commands are the INFO commandstats delta over a run (commands inside Lua scripts and
MULTI blocks count; the bench's own polling does not), divided by N. Worker CPU is the
worker processes' user+system time over the run, divided by N. RSS is the peak of the
workers' summed RSS above its level at the start of the run.
"""

from __future__ import annotations

import argparse
import compileall
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

import redis
import yaml
from celery._state import _set_task_join_will_block

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.harness import Meter, load, openai_server, workers  # noqa: E402
from bench.report import Row, machine, print_rows, print_targets  # noqa: E402
from bench.runs import (  # noqa: E402
    asyncio_run,
    bare_http_chord_run,
    chord_run,
    cli_run,
    fleet_run,
    http_chord_run,
    rooted_chord_run,
)
from fleet.client import Fleet  # noqa: E402
from fleet.settings import Settings  # noqa: E402
from fleetops.redis_server import start_redis_server  # noqa: E402
from tests.fleetkit import explore_script  # noqa: E402
from workers.app import app  # noqa: E402

HTTP_PROVIDER = "bench"


class Bench:
    """The processes of one benchmark and how to measure a row on them."""

    def __init__(self, fleet: Fleet, meter: Meter, pids: list[int], tmp: Path, env: dict[str, str]):
        self.fleet, self.meter, self.pids, self.tmp, self.env = fleet, meter, pids, tmp, env
        self.base_url = ""

    def scripted(self, n: int, latency_ms: int, repeat: int) -> Row:
        model = explore_script(
            self.tmp / f"explore-{n}-{latency_ms}.yaml", n, latency_ms=latency_ms
        )
        fleet, peer, same = [], [], []
        for _ in range(repeat):
            fleet.append(
                fleet_run(self.fleet, self.meter, self.pids, "survey the workspace", model)
            )
            peer.append(chord_run(self.meter, self.pids, n, latency_ms))
            same.append(rooted_chord_run(self.meter, self.pids, n, latency_ms))
        ideal = statistics.median(asyncio_run(n, latency_ms, True) for _ in range(repeat))
        return Row.of("scripted", n, latency_ms, fleet, peer, ideal, same=same)

    def http(self, n: int, latency_ms: int, repeat: int) -> Row:
        task, model = f"survey the workspace in {n} branches", f"lat{latency_ms}"
        fleet, peer, bare = [], [], []
        for _ in range(repeat):
            fleet.append(
                fleet_run(self.fleet, self.meter, self.pids, task, f"{HTTP_PROVIDER}:{model}")
            )
            peer.append(http_chord_run(self.meter, self.pids, self.base_url, task, model))
            bare.append(bare_http_chord_run(self.meter, self.pids, self.base_url, n, model))
        ideal = statistics.median(asyncio_run(n, latency_ms, True) for _ in range(repeat))
        return Row.of("http", n, latency_ms, fleet, peer, ideal, bare)

    def cli_explore(self, n: int, latency_ms: int, repeat: int) -> tuple[float, float]:
        """An explore of `n` branches over HTTP through the `fleet run` process (its start-up
        included) against the plain root-and-chord making the same completions, alternated:
        the medians of each (issue 23: at most 1.5x)."""
        task, model = f"survey the workspace in {n} branches", f"lat{latency_ms}"
        cli, peer = [], []
        for _ in range(repeat):
            cli.append(cli_run(self.env, f"{HTTP_PROVIDER}:{model}", inline=False, task=task))
            peer.append(http_chord_run(self.meter, self.pids, self.base_url, task, model).seconds)
        return statistics.median(cli), statistics.median(peer)

    def one_completion(self, latency_ms: int, repeat: int) -> tuple[float, float, float]:
        """`fleet run` through the fleet and `--inline`, alternated: medians of each and of
        the pairs' differences (process start times under load vary more than the gap)."""
        model = f"{HTTP_PROVIDER}:lat{latency_ms}"
        pairs = [
            (cli_run(self.env, model, inline=False), cli_run(self.env, model, inline=True))
            for _ in range(max(repeat, 3))
        ]
        med = statistics.median
        return med(f for f, _ in pairs), med(i for _, i in pairs), med(f - i for f, i in pairs)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=ints, default=[10, 100, 1000])
    parser.add_argument("--latencies", type=ints, default=[0, 200])
    parser.add_argument("--http-sizes", type=ints, default=[100, 500])
    parser.add_argument("--http-latency", type=int, default=200)
    parser.add_argument("--pool", default="threads", choices=["threads", "prefork", "gevent"])
    # Defaults: the layout docs/performance.md recommends (a process per core, 100 threads).
    parser.add_argument("--concurrency", type=int, default=100, help="threads per worker")
    parser.add_argument("--workers", type=int, default=2, help="processes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="only the target rows, one repeat")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeat = [100, 1000], 1
    return args


def environment(redis_url: str, tmp: Path, base_url: str) -> dict[str, str]:
    """What the workers and the CLI runs see: this Redis, a workspace, the fake provider."""
    workspace = tmp / "workspace"
    workspace.mkdir()
    for name in ("README.md", "setup.cfg", "main.py"):
        (workspace / name).write_text("x\n")
    config = tmp / "fleet.yaml"
    providers = {HTTP_PROVIDER: {"kind": "openai", "base_url": base_url}}
    config.write_text(yaml.safe_dump({"providers": providers}))
    return {
        "FLEET_REDIS_URL": redis_url,
        "FLEET_BROKER_URL": redis_url,
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),  # not the checkout: fleet code is no root
        "FLEET_CONFIG": str(config),
        "FLEET_ALLOW_SCRIPTED": "1",
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # The `fleet run` rows time a process start: give them the bytecode an installed package
    # has (pip compiles it at install; a checkout run under PYTHONDONTWRITEBYTECODE, as on
    # these machines, would otherwise compile every changed module on every start).
    for package in ("fleet", "fleetops", "workers"):
        compileall.compile_dir(REPO / package, quiet=1)
    config = f"pool={args.pool} concurrency={args.concurrency} workers={args.workers}"
    print(f"# {machine()}\n# {config} repeat={args.repeat} (medians)", flush=True)
    print(f"# load average before: {load()}", flush=True)
    with ExitStack() as stack:
        server = stack.enter_context(start_redis_server())
        base_url = stack.enter_context(openai_server())
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        env = environment(server.url, tmp, base_url)
        fleet = Fleet.from_env(Settings.from_env(env))  # sends through an app of its own
        # The chords and the worker ping go through the workers' app: point it at this Redis.
        app.conf.broker_url = app.conf.result_backend = server.url
        procs = stack.enter_context(workers(env, args.pool, args.concurrency, args.workers))
        # As in a worker: senders never block on results, so the backend must not
        # subscribe to each header task's result channel.
        _set_task_join_will_block(True)
        client = stack.enter_context(redis.Redis.from_url(server.url, decode_responses=True))
        bench = Bench(fleet, Meter(client), [w.pid for w in procs], tmp, env)
        bench.base_url = base_url
        bench.scripted(10, 0, 1)  # warm-up: imports, connections, pools
        bench.http(10, 0, 1)
        rows = print_rows(
            [
                (lambda n=n, lat=lat: bench.scripted(n, lat, args.repeat))
                for lat in args.latencies
                for n in args.sizes
            ]
            + [(lambda n=n: bench.http(n, args.http_latency, args.repeat)) for n in args.http_sizes]
        )
        one = bench.one_completion(args.http_latency, args.repeat)
        cli_s, chord_s = bench.cli_explore(100, args.http_latency, max(args.repeat, 3))
        print(
            f"# fleet run (CLI process) explore of 100 branches over HTTP: {cli_s:.2f} s;"
            f" plain root + chord, same completions: {chord_s:.2f} s;"
            f" ratio {cli_s / chord_s:.2f} (issue 23 target <= 1.5)"
        )
        print(f"# load average after: {load()} (other processes share these cores)")
        print_targets(rows, one, args.workers * args.concurrency)


if __name__ == "__main__":
    main()
