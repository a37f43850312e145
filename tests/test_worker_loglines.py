"""Celery's own outage tracebacks in a worker's log, said in one line (`workers.loglines`)."""

from __future__ import annotations

import logging

import pytest

from workers import loglines


def test_the_event_loops_cleanup_after_a_lost_broker_is_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What Celery's event loop logs when a RabbitMQ restart breaks the hub's reset (a chaos
    # run: seed 43 round 91), and what any other error there still logs.
    loglines.install()
    loglines.install()  # once per process, however often the signal fires
    logger = logging.getLogger("celery.worker.loops")
    assert sum(isinstance(f, loglines.OutageInOneLine) for f in logger.filters) == 1
    for exc in (BrokenPipeError(32, "Broken pipe"), KeyError("a bug")):
        try:
            raise exc
        except Exception as caught:
            logger.exception("Error cleaning up after event loop: %r", caught)
    outage, bug = caplog.records
    assert (outage.levelname, outage.exc_info) == ("WARNING", None)
    assert outage.getMessage() == (
        "Error cleaning up after event loop: BrokenPipeError(32, 'Broken pipe') (broker away)"
    )
    assert bug.levelname == "ERROR" and bug.exc_info is not None
