"""`fleet flower`'s process: Flower, with its Prometheus endpoint brought under control.

Flower serves `/metrics` to anyone, even when every other page asks for the login, and
labels its task metrics with the task name — for the fleet, the `shadow` name, which holds
the first words of a task. Before Flower starts, this module:

- puts `/metrics` behind the same login as the rest (`--basic-auth` / FLOWER_BASIC_AUTH;
  on loopback without a login it stays open, like the API);
- labels task metrics with the task kind only (`fleet.main`, `fleet.explore`, ...), never
  task text: bounded label cardinality, nothing of a prompt in a scrape.

Run as `python -m fleetops.flower [celery flower options]`.
"""

from __future__ import annotations

import sys
from typing import Any

METRIC_NAME_MAX_CHARS = 40


def metric_task_name(name: str) -> str:
    """`fleet.explore: Branch 3 of …` -> `fleet.explore`; other names up to their first space."""
    head = name.split(":", 1)[0].split(" ", 1)[0]
    return head[:METRIC_NAME_MAX_CHARS] or "unknown"


def secure_flower() -> None:
    """Patch Flower's `/metrics` handler and task metrics in place (before it serves)."""
    from flower.events import PrometheusMetrics
    from flower.views import monitor
    from tornado import web

    serve_metrics = monitor.Metrics.get

    @web.authenticated
    async def get(self: Any) -> None:
        await serve_metrics(self)

    monitor.Metrics.get = get
    observe_task = PrometheusMetrics.observe_task

    def observe(self: Any, worker: str, event: dict[str, Any], task: Any) -> None:
        name = metric_task_name(str(event.get("name") or getattr(task, "name", "") or ""))
        observe_task(self, worker, {**event, "name": name}, _Named(task, name))

    PrometheusMetrics.observe_task = observe


class _Named:
    """A task seen through a name fit for a metric label; everything else as it is."""

    def __init__(self, task: Any, name: str) -> None:
        self._task = task
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._task, attribute)


def guard_code(command: str) -> None:
    """`check_interpreter` on this process's roots; one line and exit 2 when refused."""
    from fleet.errors import ConfigError
    from fleet.security.trust import check_interpreter
    from fleet.settings import process_settings

    try:
        check_interpreter(process_settings().workspace_roots)
    except ConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def main(argv: list[str]) -> None:
    """Secure Flower, then run `celery --app workers.app:app flower ARGV`.

    Its imports are guarded first: Celery's `--app` imports with the working directory on
    `sys.path` (`celery.utils.imports.import_from_cwd`).
    """
    guard_code("fleet flower")
    from celery.bin.celery import main as celery_main

    secure_flower()
    sys.argv = ["celery", "--app", "workers.app:app", "flower", *argv]
    celery_main()


if __name__ == "__main__":
    main(sys.argv[1:])
