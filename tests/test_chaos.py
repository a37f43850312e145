"""The standing check: a small seeded run of the randomised fleet (`bench/chaos.py`).

Three rounds, one on each backend (single Redis, Sentinel with a replica, a 3-master
Cluster with replicas; a Redis broker, and RabbitMQ where the machine has one), run side
by side as three `bench/chaos.py --round R` processes (each round is its own replay
command, and a process's key layout is that of its one backend). Each round draws two
trees and one fault: every tree ends within the bound, nothing is lost or written twice,
token totals and budgets are what the turns spent, no worker logs a traceback or a
secret, a CLI error is one line. `SEED` draws the features below. `make chaos` is the
large run (docs/reliability.md). A failure prints the round's replay command.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import chaos
from bench.chaos_parts.backends import BACKENDS
from tests.test_fleet_rabbitmq import RABBITMQ_URL, rabbitmq_answers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
SEED = 109
"""Draws a `fleet batch` file, an experience run, a Batch API explore, a budget, a
hostile-provider explore and memory (with the brokers `redis` and `rabbitmq`)."""
ROOT = Path(__file__).resolve().parent.parent


def brokers() -> tuple[str, ...]:
    """RabbitMQ too where it answers and a vhost of the run's own can be made."""
    if shutil.which("rabbitmqctl") and rabbitmq_answers(RABBITMQ_URL):
        return ("redis", "rabbitmq")
    return ("redis",)


def test_a_small_seeded_chaos_run_on_every_backend_breaks_no_invariant() -> None:
    options = chaos.Options(
        seed=SEED,
        rounds_per_backend=1,
        trees=(2, 2),
        per_round=(1, 1),
        window_s=1.5,
        bound_s=45.0,
        workers=1,
        freeze_s=(1.0, 2.5),
        brokers=brokers(),
    )
    assert {chaos.session_of(options, r)[0] for r in range(3)} == set(BACKENDS)
    commands = [chaos.replay_command(options, r).split() for r in range(3)]
    runs = [
        subprocess.Popen(
            [sys.executable, *command[1:]],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]
    outputs = [run.communicate(timeout=280)[0] for run in runs]
    for command, run, output in zip(commands, runs, outputs, strict=True):
        print(output)
        assert run.returncode == 0, f"{' '.join(command)}:\n{output}"
