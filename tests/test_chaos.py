"""The standing check: a small seeded run of the randomised fleet (`bench/chaos.py`).

Three rounds, one on each backend (single Redis, Sentinel with a replica, a 3-master
Cluster with replicas; a Redis broker, and RabbitMQ where the machine has one), a few
trees of the drawn kinds each and two faults per round: every tree ends within the bound,
nothing is written twice, token totals and budgets are what the turns spent, no worker
logs a traceback or a secret, a CLI error is one line. Seed 4 draws explores, a budget, a
per-root cap, MCP calls (quick, huge, slow) and an explore on the hostile provider.
~45 s alone on 2 cores, ~90 s beside a chaos run. `make chaos` is the large run
(docs/reliability.md). A failure prints the round's replay command.
"""

from __future__ import annotations

import shutil

import pytest

from bench import chaos
from tests.test_fleet_rabbitmq import RABBITMQ_URL, rabbitmq_answers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def brokers() -> tuple[str, ...]:
    """RabbitMQ too where it answers and a vhost of the run's own can be made."""
    if shutil.which("rabbitmqctl") and rabbitmq_answers(RABBITMQ_URL):
        return ("redis", "rabbitmq")
    return ("redis",)


def test_a_small_seeded_chaos_run_on_every_backend_breaks_no_invariant() -> None:
    options = chaos.Options(
        faults=6,
        seed=4,
        rounds_per_backend=1,
        trees=(2, 3),
        per_round=(2, 2),
        window_s=2.0,
        bound_s=45.0,
        workers=1,
        brokers=brokers(),
    )
    table = chaos.run(options, say=print)
    report = table.markdown(options) + "\n" + "\n".join(table.failing)
    assert all(row.rounds >= 1 for row in table.rows.values()), report
    for name, row in table.rows.items():
        assert row.stuck == [], f"{name}: {row.stuck}\n{report}"
        assert row.doubled == [], f"{name}: {row.doubled}\n{report}"
        assert row.tracebacks == [], f"{name}: {row.tracebacks}\n{report}"
        assert row.secrets == [], f"{name}: {row.secrets}\n{report}"
        assert row.cli == [], f"{name}: {row.cli}\n{report}"
        assert row.costs == [], f"{name}: {row.costs}\n{report}"
