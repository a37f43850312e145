"""`fleet metrics` (the Prometheus endpoint of `fleetops.metrics`) and `fleet probe`."""

from __future__ import annotations

import argparse

from fleet.errors import ConfigError
from fleet.settings import process_settings
from fleet.storage.backends.redis.connect import redact_url
from fleetops.cli.exit_codes import ExitCode
from fleetops.discovery import fleet_settings
from workers import probes


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
    return ExitCode.OK


def run_probe(args: argparse.Namespace) -> int:
    """`fleet probe`: 0 when the probe passes, 1 (with the reason) when not."""
    probe_dir = process_settings().probe_dir
    reason = probes.check(probe_dir, ready=args.ready, max_age_s=args.max_age_s)
    if reason is None:
        print("ok")
        return ExitCode.OK
    print(reason)
    return ExitCode.FAILED
