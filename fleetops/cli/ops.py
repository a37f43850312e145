"""`fleet up|worker|flower|doctor|migrate`: the commands that run a fleet.

Their arguments are in `fleetops.cli.commands`; Celery is imported inside the handlers.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from fleet.errors import ConfigError
from fleet.security.trust import check_interpreter
from fleet.settings import forget_process_settings
from fleetops.cli.args import is_loopback
from fleetops.cli.exit_codes import ExitCode

if TYPE_CHECKING:
    from fleetops.doctor import Check

DEFAULT_CONCURRENCY = {"threads": 16, "gevent": 100}
"""Threads by default: the gevent pool opens a Redis connection per task (CELERY-NOTES).
Prefork defaults to Celery's own choice, one process per CPU."""
FLOWER_AUTH_ENV = "FLOWER_BASIC_AUTH"


def run_up(args: argparse.Namespace) -> int:
    """`fleet up`: see `fleetops.local.run_up`."""
    from fleetops.local import UpOptions
    from fleetops.local import run_up as start_fleet

    options = UpOptions(
        workers=args.workers,
        concurrency=args.concurrency,
        flower=args.flower,
        flower_port=args.flower_port,
        redis_port=args.redis_port,
        directory=Path.cwd(),
    )
    return start_fleet(options, lambda line: print(f"fleet up: {line}", flush=True))


def parse_queues(text: str | None) -> list[str]:
    """The `-Q` list, each name checked against the fleet's queues."""
    from workers.app import QUEUES

    if not text:
        return list(QUEUES)
    queues = [q.strip() for q in text.split(",") if q.strip()]
    unknown = [q for q in queues if q not in QUEUES]
    if unknown or not queues:
        raise ConfigError(f"unknown queue(s) {unknown!r}: choose from {', '.join(QUEUES)}")
    return queues


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The `celery worker` arguments for these options, task events on.

    Without mingle and gossip: mingle holds every start a second to ask each running
    worker for the task ids it revoked, and the fleet revokes by stamped headers, which
    mingle does not share; gossip has each worker follow every other's events (CPU that
    grows with the fleet, celery/celery#2566), and the fleet tells live workers by their
    heartbeats in Redis.
    """
    argv = ["worker", "-Q", ",".join(parse_queues(args.queues)), "--pool", args.pool, "-E"]
    argv += ["--without-mingle", "--without-gossip"]
    concurrency = args.concurrency or DEFAULT_CONCURRENCY.get(args.pool)
    if args.autoscale and args.pool == "threads":
        raise ConfigError("--autoscale needs --pool prefork or gevent: threads cannot resize")
    if args.autoscale:
        argv += ["--autoscale", args.autoscale]
    elif concurrency:
        argv += ["--concurrency", str(concurrency)]
    argv += ["--loglevel", args.loglevel]
    return argv + (["--hostname", args.hostname] if args.hostname else [])


def run_worker(args: argparse.Namespace) -> int:
    """`fleet worker`: one worker in this process (gevent: exec'd, it must patch first)."""
    from fleetops.discovery import fleet_env, fleet_settings
    from fleetops.supervisor import guard_orphan

    argv = worker_argv(args)
    settings = fleet_settings()
    check_interpreter(settings.workspace_roots)  # the worker_init signal checks it too
    env = fleet_env(settings)
    # A launcher's write (tests/test_imports.py allows it here): the Celery runtime below
    # and its pool children read their settings from this process's environment.
    os.environ.update(env)
    forget_process_settings()  # ... and this process reads them again on first use
    guard_orphan(env)  # under `fleet up`: never outlive it by more than a short drain
    if args.pool == "gevent":
        if importlib.util.find_spec("gevent") is None:
            raise ConfigError("the gevent pool needs gevent: pip install gevent")
        _exec_worker(argv, env)
    from workers import start
    from workers.app import app, celery_urls

    # The URLs as found (discovery), as the app reads them: the result backend its own
    # (FLEET_RESULT_BACKEND_URL: on a cluster, a single Redis apart; it was set to the
    # store's URL here, so a cluster's workers ran the chord join on a cluster node).
    app.conf.update(celery_urls(settings))
    return start.main(argv[1:])  # Celery's `worker` command, not its umbrella `celery`


def _exec_worker(argv: list[str], env: dict[str, str]) -> NoReturn:
    from fleetops.supervisor import python_module

    command = python_module("workers", *argv[1:])  # the options after `worker`
    sys.stdout.flush()
    os.execve(sys.executable, command, env)


def flower_env(address: str, basic_auth: str | None, env: dict[str, str]) -> dict[str, str]:
    """Flower's environment: credentials off loopback, the open API on loopback only.

    Raises:
        ConfigError: a non-loopback address without credentials, or malformed ones.
    """
    env = dict(env)
    auth = basic_auth or env.get(FLOWER_AUTH_ENV, "")
    if auth and not all(":" in pair and pair.split(":", 1)[0] for pair in auth.split(",")):
        raise ConfigError("basic auth must be USER:PASS (comma-separated for several users)")
    if auth:
        env[FLOWER_AUTH_ENV] = auth  # via the environment: argv is visible to `ps`
    if is_loopback(address):
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
        return env
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    if not auth:
        raise ConfigError(
            f"Flower on {address!r} would be open to the network:"
            f" pass --basic-auth USER:PASS or set {FLOWER_AUTH_ENV}"
        )
    return env


def run_flower(args: argparse.Namespace) -> int:
    """`fleet flower`: replaces this process with Flower on the fleet's broker."""
    from fleetops.discovery import fleet_env, fleet_settings
    from fleetops.local import check_port_free
    from fleetops.supervisor import python_module

    flower_env(args.address, args.basic_auth, dict(os.environ))  # bad input: one line, first
    env = flower_env(args.address, args.basic_auth, fleet_env(fleet_settings()))
    host = "127.0.0.1" if args.address in ("", "localhost") else args.address
    check_port_free(args.port, "Flower", host=host)
    # Through fleetops.flower: /metrics behind the same login, no task text in its labels.
    command = python_module("fleetops.flower", f"--port={args.port}", f"--address={args.address}")
    sys.stdout.flush()
    os.execve(sys.executable, command, env)


def run_doctor(args: argparse.Namespace) -> int:
    """`fleet doctor`: 0 when the fleet can run a task, 1 when not, 2 when unreachable."""
    from fleetops import doctor
    from fleetops.cli.output import print_json
    from fleetops.discovery import fleet_settings

    checks = doctor.run_checks(fleet_settings())
    ready = doctor.is_ready(checks)
    if args.json:
        print_json({"ready": ready, "checks": [c.as_dict() for c in checks]})
        return ExitCode.OK if ready else ExitCode.FAILED
    _print_checks(checks)
    missing = doctor.missing_queues(checks)
    if ready:
        print("ready: the fleet can run a task")
    else:
        print(f"not ready: no worker consumes {', '.join(missing)}")
    return ExitCode.OK if ready else ExitCode.FAILED


def _print_checks(checks: list[Check]) -> None:
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        table = Table("check", "status", "detail")
        for check in checks:
            table.add_row(check.name, Text(check.status, colour[check.status]), Text(check.detail))
        Console().print(table)
        return
    width = max(len(check.name) for check in checks)
    for check in checks:
        print(f"{check.name:<{width}}  {check.status:<4}  {check.detail}")


def run_migrate(args: argparse.Namespace) -> int:
    """`fleet migrate`: see `fleetops.migrate`."""
    import redis

    from fleet.storage.backends.redis.connect import connect, unreachable
    from fleetops.discovery import fleet_settings
    from fleetops.migrate import migrate
    from fleetops.migrate_runstate import migrate_run_state

    settings = fleet_settings()
    url = settings.redis_url
    try:
        client = connect(url, settings.redis_sentinel_master)
        done = migrate(client, dry_run=args.dry_run)
        lifted = migrate_run_state(client, dry_run=args.dry_run)
    except redis.RedisError as exc:
        raise unreachable(url, exc) from None
    print(done.line(args.dry_run))
    if lifted:  # traces an earlier release left mid-way keep where they were
        verb = "would lift" if args.dry_run else "lifted"
        print(f"{verb} the run state of {lifted} trace(s) out of their metadata")
    return ExitCode.OK
