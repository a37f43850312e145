"""`fleet demo`: a local fleet on an embedded Redis running one explore, then shut down."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fleet.client import Fleet
from fleet.errors import ConfigError
from fleet.runtime import operator_config
from fleet.security.trust import ALLOW_SCRIPTED_ENV, WORKSPACE_ROOTS_ENV, check_interpreter
from fleet.settings import Settings
from fleetops.cli.output import printable, render_tree
from fleetops.cli.run import show_progress
from fleetops.discovery import discover_redis_url, read_state

EXAMPLE = Path(__file__).resolve().parents[2] / "fleet" / "examples" / "explore.yaml"
DEMO_TASK = "Survey this workspace in five parallel branches and summarise what you find."
STATE_DIR = Path(".fleet") / "demo"
READY_TIMEOUT_S = 90.0


def register(commands: Any) -> None:
    """Add `demo`."""
    parser = commands.add_parser("demo", help="start a local fleet, run one explore, stop")
    parser.add_argument("--model", help="default: FLEET_MODEL or fleet.yaml, else scripted")
    parser.add_argument("--task", default=DEMO_TASK)
    parser.add_argument("--workspace", type=Path, default=Path.cwd())
    parser.set_defaults(handler=run_demo)


def demo_model(explicit: str | None, settings: Settings) -> str:
    """A configured real model if there is one, else the bundled scripted explore."""
    if explicit:
        return explicit
    default = settings.model or operator_config(settings).default_model
    return default or f"scripted:{EXAMPLE}"


def demo_env(workspace: Path) -> dict[str, str]:
    """The demo's environment: scripted models on, the workspace a root unless set."""
    env = {k: v for k, v in os.environ.items() if k != "FLEET_REDIS_URL"}
    env[ALLOW_SCRIPTED_ENV] = "1"
    # `fleet up` runs in STATE_DIR, so its default root would not hold the workspace.
    env.setdefault(WORKSPACE_ROOTS_ENV, str(workspace.expanduser().resolve()))
    return env


def run_demo(args: argparse.Namespace) -> int:
    """Bring a fleet up in the background, run the task through it, bring it down."""
    base_env = demo_env(args.workspace)
    settings = Settings.from_env(base_env)
    check_interpreter(settings.workspace_roots)  # else the workers refuse, less clearly
    model = demo_model(args.model, settings)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    print(f"starting a local fleet (state in {STATE_DIR}/) ...", file=sys.stderr)
    up = subprocess.Popen(
        [sys.executable, "-m", "fleetops.cli.main", "up", "--workers", "1"],
        cwd=STATE_DIR,
        env=base_env,
        start_new_session=True,
    )
    try:
        url = wait_ready(up)
        env = {**base_env, "FLEET_REDIS_URL": url, "FLEET_BROKER_URL": url}
        settings = Settings.from_env(env).with_workspace(args.workspace)
        return submit_and_show(Fleet.from_env(settings), args.task, model)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=30)


def wait_ready(up: subprocess.Popen[bytes]) -> str:
    """The fleet's Redis URL once `fleet up` reports its workers ready."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise ConfigError(
                f"`fleet up` exited with {up.returncode}; see {STATE_DIR}/.fleet/logs"
            )
        state = read_state(STATE_DIR / ".fleet")
        url = discover_redis_url(STATE_DIR, env={})
        if state is not None and state.ready and url:
            return url
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
    return 0 if trace.status == "completed" else 1
