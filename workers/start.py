"""Start a worker of the fleet: Celery's `worker` command, without its umbrella command.

`celery -A workers.app:app worker ...` and `app.worker_main` both go through the `celery`
click group (`celery.bin.celery`), whose import loads every subcommand (`amqp` brings
click_repl and prompt_toolkit, `shell`, `multi`...) and the `celery.commands` entry-point
plugins (Flower, and with it tornado): ~0.6 s of CPU per worker start, for commands a
worker never runs. `main` runs the `worker` command itself (`python -m workers ...`,
`fleet worker`), taking the same options after `worker`.

Written against Celery 5.7.0. `python -m celery` (`celery.__main__`) first applies the
gevent or eventlet monkey patches a `-P` option asks for (`celery.maybe_patch_concurrency`):
`main` does too, before anything else imports. Then the group's callback
(`celery.bin.celery.celery`) does this before the subcommand runs; what `main` keeps:
- `-A`: `find_app` imports the app; here it is `workers.app.app`, imported.
- `ctx.obj = CLIContext(app, no_color, workdir, quiet)`: the worker command reads
  `ctx.obj.app`, `.no_color`, `.quiet` (and `.error`). `--no-color` comes from `NO_COLOR`
  as the group's option does; `--workdir` and `--quiet` are not offered (no fleet path
  used them).
- the app's `user_options` for `worker` and `preload` added to the worker's parameters:
  the fleet's app declares none; added all the same, as the group does.
- `celery.bin.base` builds a pygments `PythonLexer` at import when pygments is installed
  (~0.1 s of CPU compiling its regexes) for `CLIContext.pretty`, which colours the JSON
  replies of `celery inspect`; a worker never calls it. It is imported with pygments
  hidden, and takes its own fallback for a missing pygments (`LEXER = None`).
- `--detach` re-executes `python -m celery` with the process's own argv, which here has
  no `-A ... worker`: refused (a supervisor or `fleet up` keeps workers running).
- `-b`, `--result-backend`, `--loader`, `--config`, `--skip-checks` set `CELERY_*`
  variables: the fleet takes its URLs from its settings, so none are offered; nor are
  `CELERY_WORKER_*` variables read as options (`celery.bin.celery.main`'s
  `auto_envvar_prefix`, which `app.worker_main` never had either).
tests/test_worker_start.py asserts these on Celery itself, so an upgrade that changes them
fails there.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

PROG = "python -m workers"
DETACH = frozenset({"--detach", "-D"})
TRUE_WORDS = frozenset({"1", "true", "t", "yes", "y", "on"})
"""What click reads as a set flag from its environment variable (`NO_COLOR`)."""


def main(argv: Sequence[str]) -> int:
    """Run `celery worker` with these options on the fleet's app; its exit code.

    A bad option prints click's usage error and returns its code (2).
    """
    if DETACH & set(argv):
        print(f"{PROG}: --detach is not supported: run it under a supervisor", file=sys.stderr)
        return 2
    import celery

    celery.maybe_patch_concurrency([PROG, *argv])  # gevent: before anything opens a socket
    from fleet.hidden_imports import hidden, import_redis_without_metrics_sdk

    import_redis_without_metrics_sdk()  # before Celery and kombu import redis-py
    from fleet.errors import ConfigError
    from fleet.security.trust import check_interpreter
    from fleet.settings import process_settings

    try:  # before Celery imports task modules with the working directory on sys.path
        check_interpreter(process_settings().workspace_roots)
    except ConfigError as exc:
        print(f"fleet worker: {exc}", file=sys.stderr, flush=True)
        return 2
    import click

    with hidden("pygments"):  # see the module's docstring
        from celery.bin.base import CLIContext
        from celery.bin.worker import worker

    from fleet.settings import process_env
    from workers.app import app

    for option in [*app.user_options["worker"], *app.user_options["preload"]]:
        if option not in worker.params:
            worker.params.append(option)
    no_color = process_env().get("NO_COLOR", "").lower() in TRUE_WORDS
    context = CLIContext(app=app, no_color=no_color, workdir=None, quiet=False)
    try:
        code = worker.main(list(argv), prog_name=PROG, obj=context, standalone_mode=False)
    except click.ClickException as error:
        error.show()
        return error.exit_code
    return int(code or 0)
