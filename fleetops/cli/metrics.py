"""`fleet metrics` (the Prometheus endpoint of `fleetops.metrics`) and `fleet probe`."""

from __future__ import annotations

import argparse
from typing import Any

from fleet.errors import ConfigError
from fleet.settings import process_settings
from fleet.storage.redis_connect import redact_url
from fleetops.cli.args import port_number, positive_float
from fleetops.discovery import fleet_settings
from fleetops.metrics import DEFAULT_PORT
from workers import probes


def register(commands: Any) -> None:
    """Add `fleet metrics` and `fleet probe`."""
    parser = commands.add_parser("metrics", help="serve Prometheus metrics of the fleet")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT)
    parser.add_argument("--address", default="127.0.0.1", help="default 127.0.0.1")
    parser.set_defaults(handler=run_metrics)
    _add_probe(commands)


def run_metrics(args: argparse.Namespace) -> int:
    """`fleet metrics`: serve until interrupted."""
    from fleetops.metrics import FleetMetrics, make_server

    metrics = FleetMetrics(fleet_settings())
    try:
        server = make_server(metrics, args.address, args.port)
    except OSError as exc:
        metrics.close()
        raise ConfigError(f"cannot serve metrics on {args.address}:{args.port}: {exc}") from None
    where = redact_url(metrics.settings.redis_url)
    print(f"fleet metrics on http://{args.address}:{args.port}/metrics ({where})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        metrics.close()
    return 0


def _add_probe(commands: Any) -> None:
    probe = commands.add_parser("probe", help="liveness/readiness probe of a worker container")
    probe.add_argument("--ready", action="store_true", help="check readiness instead")
    probe.add_argument(
        "--max-age-s",
        type=positive_float,
        default=probes.DEFAULT_MAX_AGE_S,
        help=f"liveness: the oldest heartbeat that passes (default {probes.DEFAULT_MAX_AGE_S:g})",
    )
    probe.set_defaults(handler=run_probe)


def run_probe(args: argparse.Namespace) -> int:
    """`fleet probe`: 0 when the probe passes, 1 (with the reason) when not."""
    probe_dir = process_settings().probe_dir
    reason = probes.check(probe_dir, ready=args.ready, max_age_s=args.max_age_s)
    if reason is None:
        print("ok")
        return 0
    print(reason)
    return 1
