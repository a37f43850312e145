"""Every `fleet` command's arguments, and where its handler lives ("module:function").

It imports argparse, `fleetops.cli.args` and two constants, nothing else: `fleet --help`
and an argument error exit without loading Redis, HTTP, OpenTelemetry, Celery or LLM code.
`fleetops.cli.main` imports a command's handler module only once the arguments parsed, so
`fleet run` loads what submitting and following a trace needs, not what `fleet up` does.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import Any

from fleet.batch import DEFAULT_MAX_IN_FLIGHT
from fleetops.cli.args import autoscale, integer, number, port_number, positive_float, positive_int
from workers.probes import DEFAULT_MAX_AGE_S

POOLS = ("threads", "prefork", "gevent")
DEFAULT_FLOWER_PORT = 5555
DEFAULT_SERVE_PORT = 8600
DEFAULT_A2A_PORT = 8700
DEFAULT_METRICS_PORT = 9808
DEMO_TASK = "Survey this workspace in five parallel branches and summarise what you find."


def build_parser() -> argparse.ArgumentParser:
    """The parser with every command; each sets `handler` to a "module:function" string."""
    parser = argparse.ArgumentParser(prog="fleet", description="Run LLM sub-agents as jobs.")
    parser.add_argument("--version", action=_Version, nargs=0, help="print the release and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_run, _add_follow, _add_trace, _add_batch, _add_ops, _add_servers, _add_demo):
        add(commands)
    return parser


class _Version(argparse.Action):
    """`fleet --version`: the release and the record schema it writes (read when asked)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        from importlib.metadata import version

        from fleet.models import SCHEMA_VERSION, TASK_SCHEMA

        schemas = f"record schema {SCHEMA_VERSION}, task schema {TASK_SCHEMA}"
        print(f"fleet {version('agent-fleet')} ({schemas})", flush=True)  # stdout, as argparse's
        parser.exit(0)


def _command(commands: Any, name: str, handler: str, **options: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, **options)
    parser.set_defaults(handler=handler)
    return parser


def _add_run(commands: Any) -> None:
    run = _command(
        commands, "run", "fleetops.cli.run:run", help="run a task (in-process with --inline)"
    )
    add_run_arguments(run)
    run.set_defaults(check=partial(_check_task, run))
    group = run.add_argument_group("tree budget and fan-out (see docs/limits.md)")
    # numbers only here: what a budget may hold is checked by `Budget` itself (one place)
    group.add_argument("--budget-tokens", type=integer, metavar="N")
    group.add_argument("--budget-usd", type=number, metavar="X")
    group.add_argument("--budget-sub-agents", type=integer, metavar="N")
    group.add_argument("--budget-wall-s", type=number, metavar="S")
    group.add_argument(
        "--max-concurrent", type=positive_int, metavar="N", help="children running at once"
    )


def task_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with `fleet run`'s task, message, --prompt and --regenerate, if anything."""
    if args.regenerate:
        if not args.continue_id or args.after_sequence is None:
            return "--regenerate needs --continue TRACE_ID and --after-sequence N"
        return "--regenerate takes no message" if args.task is not None else None
    if args.prompt is not None and (args.continue_id or args.task is not None):
        return "--prompt is the task of a new root: no TASK, no --continue"
    if args.prompt is None and args.task is None:
        what = "the message" if args.continue_id else "the task"
        return f"give {what} (or --continue ID --after-sequence N --regenerate)"
    return "--var goes with --prompt FILE" if args.var and args.prompt is None else None


def _check_task(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse before any handler is imported (`fleet run` alone answers at once)."""
    if (problem := task_problem(args)) is not None:  # one line, as the handlers' errors
        parser.exit(2, f"fleet: error: {problem}\n")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by inline and fleet runs."""
    parser.add_argument(
        "task",
        nargs="?",
        help="what the main agent should do (with --continue: the new message)",
    )
    parser.add_argument("--inline", action="store_true", help="run in this process")
    parser.add_argument("--model", help="provider:model, an alias, or scripted:FILE.yaml")
    parser.add_argument("--preset", default="default", help="agent preset (default: default)")
    parser.add_argument(
        "--workspace", type=Path, help="workspace root (default: FLEET_WORKSPACE or .)"
    )
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH|URL",
        help="show the model this PNG/JPEG/GIF/WebP image with the task (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--timeout-s", type=positive_float, default=None, help="give up waiting after this long"
    )
    parser.add_argument(
        "--continue",
        dest="continue_id",
        metavar="TRACE_ID",
        help="continue this finished root with the message instead of starting a new one",
    )
    parser.add_argument(
        "--after-sequence",
        type=int,
        metavar="N",
        help="with --continue: first go back to message N (rewind; the old branch stays)",
    )
    parser.add_argument(
        "--prompt",
        type=Path,
        metavar="FILE.prompt",
        help="the task from a prompt file (front matter, $system$/$user$, %%variables%%)",
    )
    parser.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a %%NAME%% of the prompt file (repeatable)",
    )
    parser.add_argument(
        "--regenerate",
        action="store_true",
        help="with --continue and --after-sequence, no message: answer message N again",
    )
    parser.add_argument(
        "--memory",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="long-term memory the tree may use, e.g. user:alice (repeatable; docs/memory.md)",
    )
    parser.add_argument(
        "--human-timeout-s",
        type=positive_int,
        metavar="S",
        help="how long an ask_human question waits for `fleet reply` before the agent goes on",
    )


def _add_follow(commands: Any) -> None:
    """`watch`, `stop`, `reply`, `approve`, `deny`: commands on one trace `fleet run` started."""
    watch = _command(commands, "watch", "fleetops.cli.run:watch", help="follow a trace tree live")
    watch.add_argument("trace_id")
    watch.add_argument("--timeout-s", type=positive_float, default=None)
    stop = _command(
        commands, "stop", "fleetops.cli.run:stop", help="stop a trace and its whole subtree"
    )
    stop.add_argument("trace_id")
    reply = _command(
        commands,
        "reply",
        "fleetops.cli.run:reply",
        help="answer the question a trace waits on (ask_human); it resumes",
    )
    reply.add_argument("trace_id")
    reply.add_argument("answer")
    compact = _command(
        commands,
        "compact",
        "fleetops.cli.run:compact",
        help="summarise a finished root's conversation through a side branch (all kept)",
    )
    compact.add_argument("trace_id")
    _add_approval(commands)
    _add_send(commands)


def _add_send(commands: Any) -> None:
    """`send`: a message to a running trace, read before its next model call."""
    send = _command(
        commands,
        "send",
        "fleetops.cli.run:send",
        help="send a message to a running trace (it reads it before its next model call)",
    )
    send.add_argument("trace_id")
    send.add_argument("text")
    send.add_argument("--from", dest="sender", default="operator", help="who sends it")
    send.add_argument(
        "--interrupt",
        action="store_true",
        help="cut the trace's model call in flight and start its next turn with the message",
    )


def _add_approval(commands: Any) -> None:
    """`approve` and `deny`: answer a tool call that waits for a person's approval."""
    approve = _command(
        commands,
        "approve",
        "fleetops.cli.approval:approve",
        help="run the tool call a trace waits to have approved; it resumes",
    )
    approve.add_argument("trace_id")
    deny = _command(
        commands,
        "deny",
        "fleetops.cli.approval:deny",
        help="refuse the tool call a trace waits to have approved; the model reads the reason",
    )
    deny.add_argument("trace_id")
    deny.add_argument("reason")
    for parser in (approve, deny):
        parser.add_argument(
            "--id", dest="approval_id", help="the pending call's id (refused if another)"
        )
        parser.add_argument(
            "--digest",
            help="the digest `fleet trace list --waiting` showed with the call (refused if"
            " the waiting call is another)",
        )


def _add_trace(commands: Any) -> None:
    trace = commands.add_parser("trace", help="inspect traces")
    sub = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    show = _command(
        sub,
        "show",
        "fleetops.cli.traces:show_trace",
        help="a trace with its children and collaborators",
    )
    show.add_argument("trace_id")
    show.add_argument("--json", action="store_true")
    listing = _command(sub, "list", "fleetops.cli.traces:list_traces", help="traces, newest first")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--all", action="store_true", help="include sub-traces")
    listing.add_argument(
        "--waiting",
        action="store_true",
        help="only traces waiting on a person (a question, an approval)",
    )
    listing.add_argument("--json", action="store_true")
    _add_experience(commands)  # here, so the list of adders in build_parser stays as it is
    _add_memory(commands)


def _add_experience(commands: Any) -> None:
    """`experience add|list|show|rm|approve`: rules learnt from earlier runs."""
    experience = commands.add_parser("experience", help="rules shown to later runs")
    sub = experience.add_subparsers(dest="experience_command", required=True, metavar="ACTION")
    where = "fleetops.cli.experiences"
    add = _command(sub, "add", f"{where}:add", help="add an approved rule for a scope")
    add.add_argument("--scope", required=True, help="agent:PRESET, user:NAME or project:NAME")
    add.add_argument("--condition", required=True, help="when this holds ...")
    add.add_argument("--rule", required=True, help="... do this")
    add.add_argument("--proposed", action="store_true", help="store it unapproved")
    listing = _command(sub, "list", f"{where}:list_all", help="experiences, oldest first")
    listing.add_argument("--scope")
    show = _command(sub, "show", f"{where}:show", help="one experience with its counts")
    remove = _command(sub, "rm", f"{where}:remove", help="forget an experience")
    approve = _command(sub, "approve", f"{where}:approve", help="let runs see a proposed one")
    for parser in (show, remove, approve):
        parser.add_argument("experience_id")
    reflect = _command(
        commands,
        "reflect",
        f"{where}:reflect",
        help="a read-only agent proposes experiences from a finished tree (unapproved)",
    )
    reflect.add_argument("trace_id")
    reflect.add_argument("--model", help="the reflection's model (else the default)")
    reflect.add_argument("--timeout-s", type=positive_float, default=None)
    reflect.add_argument(
        "--scope",
        help="where the proposals go: one of the scopes the tree ran in (default: its"
        " project, else its user, else agent:PRESET); never a scope the model names",
    )
    for parser in (add, listing, show, remove, approve, reflect):
        parser.add_argument("--json", action="store_true")


def _add_memory(commands: Any) -> None:
    """`memory list|show|set|rm|history|approve NAMESPACE [KEY]`: long-term memory."""
    memory = commands.add_parser("memory", help="long-term memory every bound tree reads")
    sub = memory.add_subparsers(dest="memory_command", required=True, metavar="ACTION")
    where = "fleetops.cli.memory"
    listing = _command(sub, "list", f"{where}:list_all", help="namespaces, or a namespace's keys")
    listing.add_argument("namespace", nargs="?", help="user:alice, project:acme, fleet")
    show = _command(sub, "show", f"{where}:show", help="a key's value and version")
    setter = _command(sub, "set", f"{where}:set_value", help="write a key (compare-and-set)")
    remove = _command(sub, "rm", f"{where}:remove", help="forget a key and its history")
    history = _command(sub, "history", f"{where}:history", help="a key's kept versions")
    approve = _command(sub, "approve", f"{where}:approve", help="land the recorder's held writes")
    for parser in (show, setter, remove, history, approve):
        parser.add_argument("namespace", help="user:alice, project:acme, fleet")
    for parser in (show, setter, remove, history):
        parser.add_argument("key")
    approve.add_argument("key", nargs="?", help="only this key's held writes")
    setter.add_argument("value", help="JSON (else taken as a string)")
    setter.add_argument(
        "--expected-version",
        type=integer,
        metavar="N",
        help="write only over version N (0: only a new key)",
    )
    for parser in (listing, show, setter, remove, history, approve):
        parser.add_argument("--json", action="store_true")


def _add_batch(commands: Any) -> None:
    batch = _command(
        commands,
        "batch",
        "fleetops.cli.batch:run_batch_command",
        help="run many tasks from a JSONL or YAML file",
    )
    batch.add_argument("file", type=Path, help="JSONL (one object per line) or YAML (a list)")
    batch.add_argument("--out", type=Path, help="append one JSON line per finished task here")
    batch.add_argument(
        "--max-in-flight",
        type=positive_int,
        default=DEFAULT_MAX_IN_FLIGHT,
        help=f"most unfinished tasks at once (default {DEFAULT_MAX_IN_FLIGHT})",
    )
    batch.add_argument(
        "--resume", action="store_true", help="continue --out: skip finished ids, follow submitted"
    )
    batch.add_argument("--timeout-s", type=positive_float, help="stop a task running this long")
    batch.add_argument("--dry-run", action="store_true", help="validate FILE, submit nothing")
    batch.add_argument("--model", help="model for entries that name none")
    batch.add_argument("--preset", help="preset for entries that name none (default: default)")
    batch.add_argument(
        "--workspace",
        type=Path,
        help="workspace for entries that name none (default: FLEET_WORKSPACE or .)",
    )
    batch.add_argument(
        "--batch-api",
        action="store_true",
        help="model calls through the provider's Batch API: half the price, answers within "
        "hours (entries may say batch_api: false)",
    )


def _add_ops(commands: Any) -> None:
    """`up`, `worker`, `doctor`, `migrate`, `archive`: the commands that run or keep a fleet."""
    up = _command(
        commands,
        "up",
        "fleetops.cli.ops:run_up",
        help="run a local fleet in the foreground (Ctrl-C stops it)",
    )
    up.add_argument("--workers", type=positive_int, default=1, help="worker processes (default 1)")
    up.add_argument("--concurrency", type=positive_int, help="threads per worker (default 16)")
    up.add_argument("--flower", action="store_true", help="also start Flower on loopback")
    up.add_argument("--flower-port", type=port_number, default=DEFAULT_FLOWER_PORT)
    up.add_argument(
        "--redis-port", type=port_number, help="port of the embedded Redis (default: a free one)"
    )
    _add_worker(commands)
    doctor = _command(
        commands,
        "doctor",
        "fleetops.cli.ops:run_doctor",
        help="check Redis, broker, workers and model config",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    env = _command(
        commands,
        "env",
        "fleetops.cli.exports:run_env",
        help="print the exports that reach this fleet from any directory (with its password)",
    )
    env.add_argument("--dotenv", action="store_true", help="NAME=VALUE lines, for a .env file")
    migrate = _command(
        commands,
        "migrate",
        "fleetops.cli.ops:run_migrate",
        help="move traces an earlier version wrote into this version's layout",
    )
    migrate.add_argument("--dry-run", action="store_true", help="count, change nothing")
    archive = _command(
        commands,
        "archive",
        "fleetops.cli.archive:run_archive",
        help="export finished trees to a JSONL file (--import: read one back)",
    )
    archive.add_argument("file", help="the JSONL file (a new one when exporting)")
    archive.add_argument("roots", nargs="*", metavar="ROOT", help="root ids (default: all ended)")
    archive.add_argument("--drop", action="store_true", help="delete them from Redis once written")
    archive.add_argument(
        "--import", dest="import_file", action="store_true", help="read FILE back into Redis"
    )


def _add_worker(commands: Any) -> None:
    worker = _command(
        commands,
        "worker",
        "fleetops.cli.ops:run_worker",
        help="run one Celery worker in the foreground",
    )
    worker.add_argument("-Q", "--queues", help="comma-separated queues (default: all four)")
    worker.add_argument("-P", "--pool", choices=POOLS, default="threads")
    worker.add_argument(
        "-c", "--concurrency", type=positive_int, help="pool size (threads: 16, gevent: 100)"
    )
    worker.add_argument("--autoscale", type=autoscale, metavar="MAX,MIN")
    worker.add_argument("-l", "--loglevel", default="INFO")
    worker.add_argument("-n", "--hostname", help="node name (default celery@HOST)")


def _add_servers(commands: Any) -> None:
    """`flower`, `serve`, `mcp`, `metrics` and `probe`: what runs beside a fleet."""
    flower = _command(
        commands, "flower", "fleetops.cli.ops:run_flower", help="run Flower on the fleet's broker"
    )
    flower.add_argument("--port", type=port_number, default=DEFAULT_FLOWER_PORT)
    flower.add_argument("--address", default="127.0.0.1", help="default 127.0.0.1")
    flower.add_argument(
        "--basic-auth", metavar="USER:PASS", help="required off loopback (or $FLOWER_BASIC_AUTH)"
    )
    serve = _command(
        commands,
        "serve",
        "fleetops.cli.serve:run_serve",
        help="HTTP trace API and a live page of a trace tree",
    )
    serve.add_argument("--port", type=port_number, default=DEFAULT_SERVE_PORT)
    serve.add_argument("--address", default="127.0.0.1", help="default 127.0.0.1")
    a2a = _command(
        commands,
        "a2a",
        "fleetops.cli.a2a:run_a2a",
        help="serve the presets marked a2a: true as an A2A agent (needs FLEET_SERVE_TOKEN)",
    )
    a2a.add_argument("--port", type=port_number, default=DEFAULT_A2A_PORT)
    a2a.add_argument("--address", default="127.0.0.1", help="default 127.0.0.1")
    a2a.add_argument("--url", help="the public URL clients use, for the Agent Card")
    mcp = _command(
        commands,
        "mcp",
        "fleetops.cli.mcp:run_mcp",
        help="serve the fleet as MCP tools (stdio; --http PORT for streamable HTTP)",
    )
    mcp.add_argument("--http", type=port_number, metavar="PORT", help="streamable HTTP")
    mcp.add_argument("--address", default="127.0.0.1", help="with --http; default 127.0.0.1")
    mcp.add_argument(
        "--allow-host",
        action="append",
        metavar="HOST",
        help="with --http: a Host name clients (a proxy) use besides the address; repeatable",
    )
    metrics = _command(
        commands,
        "metrics",
        "fleetops.cli.metrics:run_metrics",
        help="serve Prometheus metrics of the fleet",
    )
    metrics.add_argument("--port", type=port_number, default=DEFAULT_METRICS_PORT)
    metrics.add_argument("--address", default="127.0.0.1", help="default 127.0.0.1")
    probe = _command(
        commands,
        "probe",
        "fleetops.cli.metrics:run_probe",
        help="liveness/readiness probe of a worker container",
    )
    probe.add_argument("--ready", action="store_true", help="check readiness instead")
    probe.add_argument(
        "--max-age-s",
        type=positive_float,
        default=DEFAULT_MAX_AGE_S,
        help=f"liveness: the oldest heartbeat that passes (default {DEFAULT_MAX_AGE_S:g})",
    )


def _add_demo(commands: Any) -> None:
    demo = _command(
        commands,
        "demo",
        "fleetops.cli.demo:run_demo",
        help="start a local fleet, run one explore, stop",
    )
    demo.add_argument("--model", help="default: FLEET_MODEL or fleet.yaml, else scripted")
    demo.add_argument("--task", default=DEMO_TASK)
    demo.add_argument("--workspace", type=Path, default=Path.cwd())
