"""`fleet demo`: a local fleet on an embedded Redis running one explore, then shut down."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from fleet.client import Fleet
from fleet.errors import ConfigError
from fleet.llm.scripted import EXAMPLE_SCRIPT
from fleet.runtime import operator_config
from fleet.security.trust import ALLOW_SCRIPTED_ENV, WORKSPACE_ROOTS_ENV, check_interpreter
from fleet.settings import Settings, process_env
from fleetops.cli.exit_codes import ExitCode
from fleetops.cli.output import printable, render_tree
from fleetops.cli.run import show_progress
from fleetops.discovery import read_state, redis_answers
from fleetops.supervisor import python_module

EXAMPLE = EXAMPLE_SCRIPT
STATE_DIR_ENV = "FLEET_STATE_DIR"
DEMO_SUFFIX = "-demo"
"""The demo's state folder sits beside the fleet's own, so a `fleet up` here is untouched."""
READY_TIMEOUT_S = 90.0


def demo_model(explicit: str | None, settings: Settings) -> str:
    """A configured real model if there is one, else the bundled scripted explore."""
    if explicit:
        return explicit
    default = settings.model or operator_config(settings).default_model
    return default or f"scripted:{EXAMPLE}"


def demo_env(workspace: Path) -> dict[str, str]:
    """The demo's environment: scripted models on, the workspace a root unless set.

    Its `fleet up` gets a state folder of its own, outside the workspace, beside the one a
    `fleet up` for the workspace would use.
    """
    real = workspace.expanduser().resolve()
    env = {k: v for k, v in process_env().items() if k != "FLEET_REDIS_URL"}
    env[ALLOW_SCRIPTED_ENV] = "1"
    env.setdefault(WORKSPACE_ROOTS_ENV, str(real))
    usual = Settings.from_env(env).fleet_state_dir(real)
    env[STATE_DIR_ENV] = str(usual.with_name(usual.name + DEMO_SUFFIX))
    return env


def run_demo(args: argparse.Namespace) -> int:
    """Bring a fleet up in the background, run the task through it, bring it down."""
    base_env = demo_env(args.workspace)
    state_dir = Path(base_env[STATE_DIR_ENV])
    settings = Settings.from_env(base_env)
    check_interpreter(settings.workspace_roots)  # else the workers refuse, less clearly
    model = demo_model(args.model, settings)
    print(f"starting a local fleet (state in {state_dir}) ...", file=sys.stderr)
    up = subprocess.Popen(
        python_module("fleetops.cli.main", "up", "--workers", "1"),
        cwd=args.workspace,
        env=base_env,
        start_new_session=True,
    )
    try:
        url = wait_ready(up, state_dir)
        env = {**base_env, "FLEET_REDIS_URL": url, "FLEET_BROKER_URL": url}
        settings = Settings.from_env(env).with_workspace(args.workspace)
        return submit_and_show(Fleet.from_env(settings), args.task, model)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=30)


def wait_ready(up: subprocess.Popen[bytes], state_dir: Path) -> str:
    """The fleet's Redis URL once `fleet up` reports its workers ready."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise ConfigError(f"`fleet up` exited with {up.returncode}; see {state_dir}/logs")
        state = read_state(state_dir)
        if state is not None and state.ready and state.pid == up.pid:
            if redis_answers(state.redis_url):
                return state.redis_url
        time.sleep(0.2)
    raise ConfigError(f"the local fleet was not ready after {READY_TIMEOUT_S:.0f} s")


def submit_and_show(fleet: Fleet, task: str, model: str) -> int:
    """Submit, stream progress, print the tree and the answer."""
    handle = fleet.submit(task, model=model)
    print(f"submitted {handle.trace_id} with model {model}", file=sys.stderr)
    show_progress(handle.events(timeout_s=600), handle.trace_id)
    trace = fleet.trace(handle.trace_id)
    print("\n".join(render_tree(fleet.store, trace)))
    print(f"\nanswer:\n{printable(trace.answer or trace.error or '')}")
    print(NEXT_STEPS, file=sys.stderr)
    return ExitCode.OK if trace.status == "completed" else ExitCode.FAILED


NEXT_STEPS = """
next steps (README.md, "The first hour"):
  1. source .venv/bin/activate; cd YOUR_PROJECT; fleet up --workers 2   # a fleet that stays
  2. fleet run ...   # in another terminal in YOUR_PROJECT: the command `fleet up` prints
  3. fleet serve     # the live page of every tree: http://127.0.0.1:8600/"""
"""What to try after the demo, printed when it ends."""
