"""`fleet metrics`: a Prometheus endpoint for queues, running sub-agents, traces and usage.

Every value is read from Redis when Prometheus scrapes, so the command keeps no state and
any number of replicas agree. The text format (0.0.4) is written here by hand: a handful of
gauges and counters read from Redis need nothing of prometheus_client's in-process registry.

KEDA scales each queue's workers on `fleet_queue_length + fleet_running_subagents`: the
queue alone cannot see the work that workers already took off it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, get_args

import redis

from fleet.models import Status, now_ms
from fleet.settings import Settings
from fleet.storage import keys
from fleet.storage.backends.redis.connect import close_client, connect, redact_url
from fleet.storage.keys import CounterName

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TRACES_WINDOW_S = 24 * 3600
"""`fleet_traces` counts the traces created this recently..."""
MAX_TRACES_SCANNED = 20_000
"""...and at most this many of them, newest first, so a scrape stays cheap."""
BATCH = 1_000
"""Trace hashes read per pipeline round trip."""
REDIS_SCHEMES = ("redis", "rediss", "unix")
REQUEST_TIMEOUT_S = 10.0
"""A connection silent this long is closed (Prometheus sends a whole request at once)."""

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Family:
    """One metric: name, type, help line and its samples (labels -> value)."""

    name: str
    kind: Literal["gauge", "counter"]
    help: str
    samples: Mapping[Labels, float]


def render(families: Iterable[Family]) -> str:
    """The Prometheus text exposition format (0.0.4) of these metrics."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape(family.help, quote=False)}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in sorted(family.samples.items()):
            text = ",".join(f'{name}="{_escape(v)}"' for name, v in labels)
            label_set = f"{{{text}}}" if text else ""
            lines.append(f"{family.name}{label_set} {_number(value)}")
    return "\n".join(lines) + "\n"


def _escape(text: str, *, quote: bool = True) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def redis_queue_lengths(client: redis.Redis, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each queue of a Redis broker: LLEN of its priority lists."""
    from kombu.transport.redis import PRIORITY_STEPS, Channel

    pipe = client.pipeline(transaction=False)
    for queue in queues:
        for step in PRIORITY_STEPS:  # kombu keeps one list per priority step
            pipe.llen(f"{queue}{Channel.sep}{step}" if step else queue)
    counts = [int(n) for n in pipe.execute()]
    steps = len(PRIORITY_STEPS)
    return {q: sum(counts[i * steps : (i + 1) * steps]) for i, q in enumerate(queues)}


def kombu_queue_lengths(broker_url: str, queues: Sequence[str]) -> dict[str, int]:
    """Messages waiting in each queue of any other broker (AMQP): a passive queue_declare."""
    from kombu.connection import Connection

    lengths: dict[str, int] = {}
    with Connection(broker_url, connect_timeout=5) as connection:
        for queue in queues:
            channel = connection.channel()  # a refused declare closes the channel on AMQP
            try:
                lengths[queue] = channel.queue_declare(queue=queue, passive=True).message_count
            except connection.channel_errors:  # never declared: nothing was ever sent to it
                lengths[queue] = 0
            finally:
                try:
                    channel.close()
                except (*connection.channel_errors, *connection.connection_errors):
                    pass
    return lengths


def _trace_fields(client: redis.Redis, trace_ids: Sequence[str], name: str) -> list[Any]:
    """One JSON-decoded field of each trace (None where the trace is gone)."""
    values: list[Any] = []
    for start in range(0, len(trace_ids), BATCH):
        pipe = client.pipeline(transaction=False)
        for trace_id in trace_ids[start : start + BATCH]:
            pipe.hget(keys.trace(trace_id), name)
        values += [None if v is None else json.loads(v) for v in pipe.execute()]
    return values


def running_by_queue(client: redis.Redis, at_ms: int) -> Counter[str]:
    """Traces whose runner holds a live lease, counted by the queue of their mode."""
    from workers.app import QUEUE_BY_MODE

    trace_ids = [str(t) for t in client.zrangebyscore(keys.RUNNING, at_ms, "+inf")]
    modes = _trace_fields(client, trace_ids, "mode")
    return Counter(QUEUE_BY_MODE[m] for m in modes if m in QUEUE_BY_MODE)


def traces_by_status(client: redis.Redis, at_ms: int) -> Counter[str]:
    """Traces created in the last TRACES_WINDOW_S (at most MAX_TRACES_SCANNED), by status."""
    since_ms = at_ms - TRACES_WINDOW_S * 1000
    trace_ids = client.zrevrangebyscore(
        keys.TRACES, "+inf", since_ms, start=0, num=MAX_TRACES_SCANNED
    )
    return Counter(s for s in _trace_fields(client, [str(t) for t in trace_ids], "status") if s)


def usage_families(client: redis.Redis) -> list[Family]:
    """Tokens and cost per model, from `keys.USAGE`."""
    tokens: dict[Labels, float] = {}
    cost: dict[Labels, float] = {}
    for name, value in client.hgetall(keys.USAGE).items():
        kind, _, model = str(name).partition(":")
        if kind == "cost_usd":
            cost[(("model", model),)] = float(value)
        elif kind in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            tokens[(("kind", kind.removesuffix("_tokens")), ("model", model))] = float(value)
    return [
        Family(
            "fleet_tokens_total",
            "counter",
            "Model tokens used, by model and kind (cached: the prompt tokens a provider's"
            " cache served, counted in prompt too).",
            tokens,
        ),
        Family("fleet_cost_usd_total", "counter", "Model cost in US dollars, by model.", cost),
    ]


def fallback_family(client: redis.Redis) -> Family:
    """Traces moved to a fallback model, from `keys.MODEL_FALLBACKS` (`[from, to]` counts)."""
    samples: dict[Labels, float] = {}
    for name, value in client.hgetall(keys.MODEL_FALLBACKS).items():
        try:
            from_model, to_model = json.loads(name)
        except (ValueError, TypeError):
            continue  # not a field this fleet wrote
        samples[(("from", str(from_model)), ("to", str(to_model)))] = float(value)
    return Family(
        "fleet_model_fallbacks_total",
        "counter",
        "Traces moved from a failing model to its fallback, by model alias.",
        samples,
    )


_LIMIT_FAMILIES = {
    "admitted": ("fleet_limit_admissions_total", "Model calls the fleet-wide limiter let through."),
    "waited": ("fleet_limit_waits_total", "Model calls told to wait (handed back), by scope."),
    "overloaded": ("fleet_provider_overloads_total", "429/503/529 answers seen, by provider."),
    "exhausted": ("fleet_limit_pauses_total", "Pauses from rate-limit headers saying none left."),
    "budget_exhausted": ("fleet_budget_exhaustions_total", "Trees stopped by their budget."),
}


def limit_families(client: redis.Redis) -> list[Family]:
    """Provider limits and tree budgets, from `keys.limit_stats()` (`what:scope` counts)."""
    samples: dict[str, dict[Labels, float]] = {what: {} for what in _LIMIT_FAMILIES}
    for name, value in client.hgetall(keys.limit_stats()).items():
        what, _, scope = str(name).partition(":")
        if what in samples:
            label = "reason" if what == "budget_exhausted" else "scope"
            samples[what][((label, scope),)] = float(value)
    return [
        Family(metric, "counter", help_text, samples[what])
        for what, (metric, help_text) in _LIMIT_FAMILIES.items()
    ]


class FleetMetrics:
    """Reads the fleet's Redis (and its broker) once per scrape; safe to share by threads."""

    def __init__(self, settings: Settings) -> None:
        """Open clients for the store and, if it is another Redis, the broker."""
        self.settings = settings
        master = settings.redis_sentinel_master
        self._store = connect(settings.redis_url, master, cluster=settings.redis_cluster)
        self._broker: redis.Redis | None = self._store
        if settings.broker_url != settings.redis_url:
            scheme = settings.broker_url.partition("://")[0]
            self._broker = connect(settings.broker_url, master) if scheme in REDIS_SCHEMES else None

    def close(self) -> None:
        """Close the Redis clients."""
        if self._broker is not None and self._broker is not self._store:
            self._broker.close()
        close_client(self._store)  # a cluster's node pools too

    def queue_lengths(self) -> dict[str, int]:
        """Messages waiting per fleet queue, on whichever broker the fleet uses."""
        from workers.app import QUEUES

        if self._broker is not None:
            return redis_queue_lengths(self._broker, QUEUES)
        return kombu_queue_lengths(self.settings.broker_url, QUEUES)

    def collect(self) -> list[Family]:
        """Every fleet metric, read now."""
        at_ms = now_ms()
        statuses = traces_by_status(self._store, at_ms)
        counters = {str(k): float(v) for k, v in self._store.hgetall(keys.COUNTERS).items()}
        return [
            Family(
                "fleet_queue_length",
                "gauge",
                "Tasks waiting in each fleet queue (not yet taken by a worker).",
                _per_queue(self.queue_lengths()),
            ),
            Family(
                "fleet_running_subagents",
                "gauge",
                "Traces whose runner holds a live lease, by the queue of their mode.",
                _per_queue(running_by_queue(self._store, at_ms)),
            ),
            Family(
                "fleet_traces",
                "gauge",
                f"Traces created in the last {TRACES_WINDOW_S // 3600} h, by status.",
                {(("status", s),): float(statuses[s]) for s in get_args(Status)},
            ),
            *usage_families(self._store),
            *limit_families(self._store),
            fallback_family(self._store),
            _counter(counters, "lease_expiries", "Runs re-enqueued after their lease expired."),
            _counter(counters, "resumes", "Parents resumed after their sub-agents were collected."),
            _counter(
                counters, "stuck_traces", "Non-terminal traces the owner check found unowned."
            ),
            _counter(counters, "batch_calls_sent", "Model calls sent in provider batches."),
            _counter(counters, "batch_answers", "Provider-batch answers read back."),
            _counter(counters, "batch_retries", "Provider-batch calls sent again (error, expiry)."),
        ]


def _per_queue(counts: Mapping[str, int]) -> dict[Labels, float]:
    """One sample per fleet queue, zero where `counts` has none (so graphs never break)."""
    from workers.app import QUEUES

    return {(("queue", q),): float(counts.get(q, 0)) for q in QUEUES}


def _counter(counters: Mapping[str, float], name: CounterName, help_text: str) -> Family:
    return Family(f"fleet_{name}_total", "counter", help_text, {(): counters.get(name, 0.0)})


def make_server(metrics: FleetMetrics, address: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server answering `/metrics` (and `/healthz`, which reads nothing)."""

    class Handler(BaseHTTPRequestHandler):
        # each connection holds a thread: one that sends nothing (or headers a byte at a
        # time) is dropped after this many seconds of silence instead of holding it forever
        timeout = REQUEST_TIMEOUT_S

        def do_GET(self) -> None:
            path = self.path.partition("?")[0]
            if _has_body(self.headers):  # never read: the connection closes after the reply
                self._reply(413, b"a scrape takes no request body\n")
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path in ("/metrics", "/"):
                self._reply(*_scrape(metrics))
            else:
                self._reply(404, b"not found: try /metrics\n")

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    return ThreadingHTTPServer((address, port), Handler)


def _has_body(headers: Message[str, str]) -> bool:
    """Whether a request announces a body (a length other than 0, or chunks)."""
    return headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in headers


def _scrape(metrics: FleetMetrics) -> tuple[int, bytes]:
    try:
        return 200, render(metrics.collect()).encode()
    except (redis.RedisError, OSError) as exc:  # a scrape error, not a crash: `up` goes to 0
        where = redact_url(metrics.settings.redis_url)
        log.warning("scrape failed: %s", type(exc).__name__)
        return 503, f"cannot read the fleet at {where}: {type(exc).__name__}\n".encode()
