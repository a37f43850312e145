"""OpenTelemetry, switched on the standard way; off and free otherwise.

`make_hooks` returns the no-op hooks unless the `otel` extra is installed *and* the
OTEL_* variables ask for traces (`Settings.otel_tracing`): then, and only then, the
OpenTelemetry SDK is imported and `fleet.observe.otel_spans.OtelHooks` records the spans.

The provider is configured as the SDK's own `opentelemetry-instrument` would:
`OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` for the resource, `OTEL_EXPORTER_OTLP_*`
for the OTLP/HTTP exporter (or `OTEL_TRACES_EXPORTER=console`), `OTEL_BSP_*` for batching.
A provider that the application (or `opentelemetry-instrument`) installed already is used
as it is.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from typing import TYPE_CHECKING

from fleet.errors import ConfigError
from fleet.observe.hooks import NO_HOOKS, Hooks
from fleet.settings import Settings
from fleet.storage.store import TraceStore

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)
_lock = threading.Lock()
INSTRUMENTATION_NAME = "agent-fleet"


def make_hooks(settings: Settings, store: TraceStore) -> Hooks:
    """OtelHooks when tracing is configured and the extra installed, else the no-op hooks."""
    if not settings.otel_tracing:
        return NO_HOOKS
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        log.warning("OTEL_* asks for traces but the otel extra is missing: agent-fleet[otel]")
        return NO_HOOKS
    from fleet.observe.otel_spans import OtelHooks

    provider = tracer_provider(settings)
    tracer = provider.get_tracer(INSTRUMENTATION_NAME)
    return OtelHooks(
        store, tracer, capture_content=settings.otel_capture_content, flush=provider.force_flush
    )


def tracer_provider(settings: Settings) -> TracerProvider:
    """The process's SDK provider: the one installed already, else one built from OTEL_*."""
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    with _lock:
        current = trace.get_tracer_provider()
        if isinstance(current, TracerProvider):
            return current
        provider = TracerProvider(resource=Resource.create())  # reads OTEL_SERVICE_NAME too
        provider.add_span_processor(BatchSpanProcessor(_exporter(settings)))
        trace.set_tracer_provider(provider)
        return provider


def _exporter(settings: Settings) -> SpanExporter:
    """`otlp` (OTLP/HTTP protobuf, the default) or `console`; anything else is refused."""
    names = settings.env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    protocol = settings.env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf").strip()
    exporter: SpanExporter
    if names == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporter = ConsoleSpanExporter()
    elif names == "otlp" and protocol in ("", "http/protobuf"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, ...
    else:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={names!r} with protocol {protocol!r} is not supported:"
            " use otlp over http/protobuf (an OpenTelemetry Collector converts) or console"
        )
    return exporter
