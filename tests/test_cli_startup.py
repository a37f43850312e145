"""`fleet --help` and a mistyped option load no Redis, HTTP, OTel, Celery or LLM code.

Each case runs the CLI in a fresh interpreter with `-X importtime`, which names on stderr
every module the process imported, however it exited (argparse exits with SystemExit).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from fleetops.cli.commands import build_parser
from fleetops.cli.main import resolve

HEAVY = ("redis", "httpx", "opentelemetry", "celery", "kombu", "pydantic", "yaml", "rich")
"""Top-level packages a command that only parses must not import."""
LLM_CODE = ("fleet.llm", "openai", "anthropic")
TIMEOUT_S = 60.0
UNREACHABLE = "redis://127.0.0.1:1/0"
"""Where a command that does connect looks: nothing listens, it fails at once."""


def imported_modules(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime -m fleetops.cli.main ARGV`; the result and every module."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fleetops.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "FLEET_REDIS_URL": UNREACHABLE, "FLEET_BROKER_URL": UNREACHABLE},
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return result, modules


def heavy_among(modules: set[str]) -> list[str]:
    return sorted(
        m for m in modules if m.split(".")[0] in HEAVY or m.startswith(LLM_CODE) or m == "fleet.llm"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["batch", "--help"],
        ["trace", "list", "--help"],
    ],
)
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    result, modules = imported_modules(*argv)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "fleetops.cli.commands" in modules, "the probe must see the CLI's own imports"
    assert heavy_among(modules) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--budget-usd", "lots", "task"],
        ["run"],
        ["worker", "--autoscale", "2,8"],
        ["no-such-command"],
        ["serve", "--port", "70000"],
    ],
)
def test_an_argument_error_is_one_line_and_imports_nothing_heavy(argv: list[str]) -> None:
    result, modules = imported_modules(*argv)
    assert result.returncode == 2, result.stderr[-2000:]
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in result.stderr
    assert said[-1].startswith("fleet") and ": error: " in said[-1], said
    assert heavy_among(modules) == []


def test_the_probe_sees_a_heavy_import() -> None:
    # The check must be able to fail: a command that connects imports redis before it fails.
    _, modules = imported_modules("trace", "list")
    assert "redis" in heavy_among(modules)


def handlers(parser: argparse.ArgumentParser) -> list[str]:
    """Every handler string of the parser and its sub-parsers."""
    found = [str(parser.get_default("handler"))] if parser.get_default("handler") else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += handlers(sub)
    return found


def test_every_command_names_a_handler_that_exists() -> None:
    names = handlers(build_parser())
    assert len(names) == 36, names  # `fleet memory` has six
    for name in names:
        assert callable(resolve(name)), name


def test_the_fleet_command_leaves_with_its_code_its_output_and_its_exit_handlers() -> None:
    code = (
        "import atexit, sys\n"
        "from fleetops.cli.main import leave\n"
        "atexit.register(lambda: print('handler ran', file=sys.stderr))\n"
        "print('answer', end='')\n"  # unflushed: leave flushes it
        "leave(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 3
    assert done.stdout == "answer"
    assert "handler ran" in done.stderr


def test_the_fleet_command_waits_for_a_thread_still_working() -> None:
    code = (
        "import threading, time\n"
        "from fleetops.cli.main import leave\n"
        "def work():\n"
        "    time.sleep(0.3)\n"
        "    print('thread done', flush=True)\n"
        "threading.Thread(target=work).start()\n"
        "leave(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert done.stdout == "thread done\n"
