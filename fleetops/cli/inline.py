"""`fleet run --inline`: a whole agent tree in this process, no Celery, no network."""

from __future__ import annotations

import argparse
import sys

from fleet.conversation.human import waiting_on
from fleet.conversation.prompts import parse_vars
from fleet.errors import ConfigError
from fleet.security.trust import check_interpreter
from fleet.settings import process_settings
from fleetops.cli.commands import task_problem
from fleetops.cli.output import approval_lines, printable, report


def check_run_arguments(args: argparse.Namespace) -> None:
    """Options that only make sense together; `ConfigError` otherwise."""
    if args.after_sequence is not None and not args.continue_id:
        raise ConfigError("--after-sequence needs --continue TRACE_ID")
    check_task_argument(args)
    if args.continue_id and args.memory:
        raise ConfigError("--continue keeps the tree's --memory namespaces")
    if args.continue_id and (args.model or args.preset != "default" or args.workspace):
        raise ConfigError("--continue keeps the trace's model, preset and workspace")
    if args.continue_id and args.image:
        raise ConfigError("--image goes with a new task, not --continue")


def check_task_argument(args: argparse.Namespace) -> None:
    """A task (or message, or prompt file) unless `--regenerate`; `ConfigError` otherwise.

    `fleet run` checks this while parsing; this is for callers that build `args` themselves.
    """
    if (problem := task_problem(args)) is not None:
        raise ConfigError(problem)


def run_inline(args: argparse.Namespace) -> int:
    """Run the task in-process and print the answer (or the JSON object)."""
    check_run_arguments(args)
    settings = process_settings()
    if args.workspace is not None or "FLEET_WORKSPACE" in settings.env:
        settings = settings.with_workspace(args.workspace or settings.workspace)
    # The tools run in this process, as in a worker: its code must be out of agents' reach.
    check_interpreter(settings.workspace_roots)  # and guards every import from here on
    from fleet.inprocess import InProcessFleet  # the runner and tools: only `--inline` runs them

    redis = bool(settings.env.get("FLEET_REDIS_URL"))
    if args.continue_id and not redis:
        raise ConfigError("--inline --continue needs the trace's store: set FLEET_REDIS_URL")
    local = InProcessFleet.from_settings(settings, redis=redis)
    if args.regenerate:
        trace = local.regenerate(args.continue_id, args.after_sequence)
    elif args.continue_id:
        trace = local.continue_trace(args.continue_id, args.task, args.after_sequence)
    else:
        trace = local.run(
            args.task,
            prompt=args.prompt,
            variables=parse_vars(args.var),
            model=args.model,
            preset=args.preset,
            images=args.image,
            memory=args.memory,
            human_timeout_s=args.human_timeout_s,
        )
    question = waiting_on(trace)
    if question is not None:
        print(printable(f"? {question['question']}"), file=sys.stderr)
        how = f"fleet reply {trace.trace_id} ANSWER"
        if question.get("kind") == "approval":
            print(approval_lines(trace.trace_id, question), file=sys.stderr)
            how = f"fleet approve {trace.trace_id}` or `fleet deny {trace.trace_id} REASON"
        print(f"waiting: answer with `{how}`", file=sys.stderr)
    return report(local.store, trace, as_json=args.json)
