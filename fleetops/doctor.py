"""`fleet doctor`: can this fleet run a task? Each check returns data; the CLI prints it."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

import redis

from fleet.errors import ConfigError
from fleet.llm.clients import validate_model
from fleet.llm.config import resolve_model_name
from fleet.presets import load_presets
from fleet.runtime import operator_config
from fleet.security.trust import api_key
from fleet.settings import Settings
from fleet.storage.backends.redis import sentinel as redis_sentinel
from fleet.storage.backends.redis.connect import connect, redact_url, unreachable
from workers.app import QUEUES, transport_options

CONNECT_TIMEOUT_S = 2.0
INSPECT_TIMEOUT_S = 1.0

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: Status
    detail: str

    def as_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return asdict(self)


def check_redis(url: str, sentinel_master: str | None = None) -> Check:
    """PING the trace store's Redis (through its sentinels, for a `sentinel://` URL).

    Raises:
        ConfigError: it does not answer; the message names the URL without its password.
    """
    client = connect(url, sentinel_master, timeout_s=CONNECT_TIMEOUT_S)
    try:
        started_s = time.perf_counter()
        client.ping()
        elapsed_ms = (time.perf_counter() - started_s) * 1000
        version = client.info("server").get("redis_version", "?")
    except redis.RedisError as exc:
        raise unreachable(url, exc) from None
    finally:
        client.close()
    return Check("redis", "ok", f"{redact_url(url)} (Redis {version}, {elapsed_ms:.1f} ms)")


def check_broker(url: str, sentinel_master: str | None = None) -> Check:
    """Connect to the broker (Redis or RabbitMQ) once, with a short timeout.

    Raises:
        ConfigError: it cannot be reached; the message names the URL without its password.
    """
    from kombu.connection import Connection

    options = transport_options(url, sentinel_master)
    kombu_url, tls = redis_sentinel.for_celery(url)  # a sentinel:// URL's options, apart
    with Connection(
        kombu_url, ssl=tls or False, connect_timeout=CONNECT_TIMEOUT_S, transport_options=options
    ) as connection:
        try:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=CONNECT_TIMEOUT_S)
        except Exception as exc:  # kombu re-raises each transport's own error types
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise ConfigError(f"cannot reach the broker at {redact_url(url)!r}: {reason}") from None
        transport = connection.transport_cls
    return Check("broker", "ok", f"{redact_url(url)} ({transport})")


def _control_app(broker_url: str, sentinel_master: str | None) -> Any:
    from celery import Celery

    kombu_url, tls = redis_sentinel.for_celery(broker_url)
    app = Celery("fleet-doctor", broker=kombu_url, set_as_current=False)
    app.conf.broker_transport_options = transport_options(broker_url, sentinel_master)
    if tls is not None:
        app.conf.broker_use_ssl = tls
    return app


def ping_workers(
    broker_url: str, timeout_s: float = INSPECT_TIMEOUT_S, sentinel_master: str | None = None
) -> set[str]:
    """Node names of the workers that answer a ping on this broker."""
    app = _control_app(broker_url, sentinel_master)
    try:
        replies = app.control.ping(timeout=timeout_s) or []
    finally:
        app.close()
    return {name for reply in replies for name in reply}


def workers_by_queue(
    broker_url: str, timeout_s: float = INSPECT_TIMEOUT_S, sentinel_master: str | None = None
) -> dict[str, list[str]]:
    """Queue name -> node names of the online workers consuming it."""
    app = _control_app(broker_url, sentinel_master)
    try:
        replies = app.control.inspect(timeout=timeout_s).active_queues() or {}
    finally:
        app.close()
    by_queue: dict[str, list[str]] = {}
    for node, queues in sorted(replies.items()):
        for queue in queues:
            by_queue.setdefault(queue["name"], []).append(node)
    return by_queue


def check_queues(by_queue: dict[str, list[str]], queues: Iterable[str] = QUEUES) -> list[Check]:
    """One check per fleet queue: failed when no worker consumes it."""
    checks = []
    for queue in queues:
        nodes = by_queue.get(queue, [])
        if nodes:
            shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
            checks.append(Check(queue, "ok", f"{len(nodes)} worker(s): {shown}"))
        else:
            checks.append(Check(queue, "fail", "no worker consumes this queue"))
    return checks


def check_model(settings: Settings) -> Check:
    """The default model resolves and has its key here; problems are warnings.

    A run may name its own model (`--model`), and workers may hold keys this shell lacks.
    """
    try:
        config = operator_config(settings)
    except ConfigError as exc:
        return Check("model", "warn", str(exc))
    try:
        name = resolve_model_name(config, settings.model, None, settings.env)
    except ConfigError:
        return Check(
            "model", "warn", "no default model: runs must pass --model (or set FLEET_MODEL)"
        )
    try:
        validate_model(config, name, settings.env, allow_scripted=settings.allow_scripted)
    except ConfigError as exc:
        return Check("model", "warn", f"{name}: {exc}")
    return Check("model", "ok", name)


def missing_keys(settings: Settings) -> list[str]:
    """Each key a provider in use lacks here, as `OPENAI_API_KEY (provider 'openai')`.

    Only providers at a public API count (a local server may need no key): those of
    fleet.yaml's model aliases and of the default model. `fleet up` says these at start,
    since its workers inherit this environment.
    """
    try:
        config = operator_config(settings)
    except ConfigError:
        return []  # `fleet doctor` and every run say what is wrong with the file
    used = {model.provider for model in config.models.values()}
    default = settings.model or config.default_model or ""
    used.add(config.models[default].provider if default in config.models else default.split(":")[0])
    found = []
    for name in sorted(used & set(config.providers)):
        provider = config.providers[name]
        try:
            api_key(settings.env, provider.api_key_env, provider.base_url, name)
        except ConfigError:
            found.append(f"{provider.api_key_env or 'api_key_env'} (provider {name!r})")
    return found


def check_presets(settings: Settings) -> Check:
    """The agents folder (FLEET_AGENTS_DIR) loads as `fleet run` would load it here.

    A warning, like the model's: workers read their own environment.
    """
    try:
        presets = load_presets(
            settings.agents_dir, settings.env, workspace_roots=settings.workspace_roots
        )
    except ConfigError as exc:
        return Check("presets", "warn", str(exc))
    return Check("presets", "ok", ", ".join(presets))


def check_owners(settings: Settings, shown: int = 5) -> Check:
    """Traces nothing moves (`fleet.owners`), as the workers' owner check would find them."""
    from fleet import owners
    from fleet.models import now_ms
    from fleet.storage.backends.redis.store import RedisStore
    from fleet.storage.owner_index import owner_index

    store = RedisStore.from_url(
        settings.redis_url, settings.redis_sentinel_master, cluster=settings.redis_cluster
    )
    try:
        quiet_ms = int(settings.stuck_after_s * 1000)
        found = owners.check(store, owner_index(store), now_ms(), quiet_ms, forget=False)
    finally:
        store.close()
    if not found:
        return Check("stuck traces", "ok", "none: every open trace has an owner")
    listed = "; ".join(f"{r.trace.trace_id} ({r.why})" for r in found[:shown])
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return Check("stuck traces", "warn", f"{len(found)} without an owner: {listed}{more}")


def check_shell() -> Check:
    """How this host bounds one bash call's processes and memory (`fleet.tools.cgroups`).

    A warning where it has no cgroups the worker may make: there `RLIMIT_NPROC` of the one
    shell user stands in, so one call's fork bomb can starve every other call. Workers on
    this host as the same user (root) find the same; elsewhere, run `fleet doctor` there.
    """
    from fleet.tools import cgroups

    host = cgroups.probe()
    return Check("shell limits", "warn" if host.version == "none" else "ok", host.describe())


def run_checks(settings: Settings) -> list[Check]:
    """Every check, in report order.

    Raises:
        ConfigError: Redis or the broker cannot be reached.
    """
    master = settings.redis_sentinel_master
    checks = [check_redis(settings.redis_url, master), check_broker(settings.broker_url, master)]
    by_queue = workers_by_queue(settings.broker_url, sentinel_master=master)
    checks += check_queues(by_queue)
    checks += [check_model(settings), check_presets(settings), check_owners(settings)]
    checks.append(check_shell())
    return checks


def is_ready(checks: Iterable[Check]) -> bool:
    """The fleet can run a task: nothing failed (warnings allowed)."""
    return all(check.status != "fail" for check in checks)


def missing_queues(checks: Iterable[Check]) -> list[str]:
    """The fleet queues no worker consumes."""
    return [c.name for c in checks if c.name in QUEUES and c.status == "fail"]
