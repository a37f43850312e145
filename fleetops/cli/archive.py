"""`fleet archive`: see `fleetops.archive`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fleetops.cli.exit_codes import ExitCode


def run_archive(args: argparse.Namespace) -> int:
    """Export finished trees to a JSONL file, or (`--import`) read one back."""
    import redis

    from fleet.errors import ConfigError
    from fleet.storage.backends.redis.connect import unreachable
    from fleetops.archive import export, import_file
    from fleetops.cli.traces import open_store
    from fleetops.discovery import fleet_settings

    settings = fleet_settings()
    path = Path(args.file)
    if args.import_file and (args.roots or args.drop):
        raise ConfigError("--import reads FILE back: it takes no ROOT ids and no --drop")
    store = open_store(settings)
    try:
        if args.import_file:
            done = import_file(store, path, settings.retention_s)
            print(done.line("imported", path))
        else:
            done = export(store, path, args.roots, drop=args.drop)
            print(done.line("archived", path) + (" and dropped them" if args.drop else ""))
    except redis.RedisError as exc:
        raise unreachable(settings.redis_url, exc) from None
    return ExitCode.OK
