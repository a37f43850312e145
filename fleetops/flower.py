"""`fleet flower`'s process: Flower, with its Prometheus endpoint brought under control.

Flower serves `/metrics` to anyone, even when every other page asks for the login, and
labels its task metrics with the task name — for the fleet, the `shadow` name, which holds
the first words of a task. Before Flower starts, this module:

- puts `/metrics` behind the same login as the rest (`--basic-auth` / FLOWER_BASIC_AUTH;
  on loopback without a login it stays open, like the API);
- labels task metrics with the task kind only (`fleet.main`, `fleet.explore`, ...), never
  task text: bounded label cardinality, nothing of a prompt in a scrape;
- without a login (loopback only), answers no other site's page and no DNS-rebinding page:
  Flower 2 then sends `Access-Control-Allow-Origin: *` and skips its cross-site checks, so
  any page the operator opened could read tasks and launch, revoke or shut down workers
  (`open_request_refusal`).

Run as `python -m fleetops.flower [celery flower options]`.
"""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import urlsplit

METRIC_NAME_MAX_CHARS = 40


def metric_task_name(name: str) -> str:
    """`fleet.explore: Branch 3 of …` -> `fleet.explore`; other names up to their first space."""
    head = name.split(":", 1)[0].split(" ", 1)[0]
    return head[:METRIC_NAME_MAX_CHARS] or "unknown"


LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
SAME_SITE_FETCH = frozenset({"same-origin", "none"})
CORS_HEADERS = (
    "Access-Control-Allow-Origin",
    "Access-Control-Allow-Headers",
    "Access-Control-Allow-Methods",
)


def open_request_refusal(
    host: str, origin: str | None, fetch_site: str | None, navigate: bool
) -> str | None:
    """Why Flower without a login must not answer a request, or None.

    Its open API (loopback only: `fleetops.cli.ops.flower_env`) would otherwise answer any
    web page the operator opens: Flower 2 sends `Access-Control-Allow-Origin: *` and skips
    its cross-site checks without a login, and a DNS-rebinding page reaches it under its
    own name. So: a loopback `Host` only, and nothing that says it comes from another site
    but a plain navigation (a link followed: the page that had it reads nothing).
    """
    name = host[1 : host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    if name not in LOOPBACK_NAMES:
        return f"Host {host[:80]!r} is not a loopback name"
    if fetch_site is not None and fetch_site not in SAME_SITE_FETCH and not navigate:
        return "a cross-site request"
    if origin is not None and urlsplit(origin).netloc != host:
        return "a request from another origin"
    return None


def _guard_open_api() -> None:
    """Flower's handlers refuse `open_request_refusal`'s requests and send no CORS headers."""
    from flower.api import BaseApiHandler
    from flower.views import BaseHandler
    from tornado import web

    def login_set(handler: Any) -> bool:
        return bool(handler.application.options.basic_auth or handler.application.options.auth)

    def guarded(prepare: Any) -> Any:
        def prepare_guarded(self: Any) -> Any:
            if not login_set(self):
                request = self.request
                navigate = request.method in ("GET", "HEAD") and (
                    request.headers.get("Sec-Fetch-Mode") == "navigate"
                )
                why = open_request_refusal(
                    request.host,
                    request.headers.get("Origin"),
                    request.headers.get("Sec-Fetch-Site"),
                    navigate,
                )
                if why is not None:
                    raise web.HTTPError(403, f"refused without a login: {why}")
            return prepare(self)

        return prepare_guarded

    set_default_headers = BaseHandler.set_default_headers

    def no_cors(self: Any) -> None:
        set_default_headers(self)
        for name in CORS_HEADERS:
            self.clear_header(name)

    BaseHandler.set_default_headers = no_cors
    BaseHandler.prepare = guarded(BaseHandler.prepare)
    BaseApiHandler.prepare = guarded(BaseApiHandler.prepare)


def secure_flower() -> None:
    """Patch Flower in place, before it serves.

    `/metrics` behind the login, task metrics by kind, and without a login no cross-site or
    rebinding request (`_guard_open_api`).
    """
    from flower.events import PrometheusMetrics
    from flower.views import monitor
    from tornado import web

    _guard_open_api()

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
