"""After a broker connection loss, Celery cancels the runs in flight only where it can.

Found by bench/chaos.py (a Redis broker restarted under a threads worker): Celery's cancel
of each acks-late run in flight raised NotImplementedError from the threads pool, and the
worker logged a traceback per run per loss. A thread cannot be ended; the run goes on
under its lease, and its redelivered message finds the lease held and returns.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workers.app import app
from workers.signals import _no_cancel_where_the_pool_cannot

SETTING = "worker_cancel_long_running_tasks_on_connection_loss"


@pytest.mark.parametrize(("pool", "cancels"), [("threads", False), ("prefork", True)])
def test_runs_are_cancelled_on_a_connection_loss_only_by_a_pool_that_can(
    pool: str, cancels: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(app.conf, SETTING, True)
    _no_cancel_where_the_pool_cannot(sender=SimpleNamespace(pool_cls=pool, app=app))
    assert app.conf[SETTING] is cancels
