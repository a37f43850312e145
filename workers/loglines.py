"""Celery's own log lines that a broker outage turns into tracebacks, said in one line.

When the broker goes away (a RabbitMQ restart), Celery's event loop resets its hub before it
reconnects, and the reset meets the dead socket: `celery.worker.loops` then logs
`Error cleaning up after event loop: BrokenPipeError(...)` with `logger.exception`, a
traceback of kombu's frames, though the worker reconnects as it should. An outage there is
one WARNING line (`fleet.storage.outage.is_outage`); any other error keeps its traceback
(the chaos harness counts the tracebacks in worker logs: each must be a defect).
"""

from __future__ import annotations

import logging

from fleet.storage.outage import is_outage

LOGGERS = ("celery.worker.loops",)
"""Celery's loggers whose exception lines an outage makes: the consumer's event loop."""


class OutageInOneLine(logging.Filter):
    """A record whose exception is an outage: a WARNING without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every record; an outage's loses its traceback."""
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and is_outage(exc):
            record.msg, record.args = f"{record.getMessage()} (broker away)", None
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def install() -> None:
    """Filter `LOGGERS` (once per process: a filter already there is not added again)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OutageInOneLine) for f in logger.filters):
            logger.addFilter(OutageInOneLine())
