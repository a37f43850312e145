"""One frozen settings object, read from the environment once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from fleet import keys
from fleet.errors import ConfigError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class Settings:
    """Everything a runner, worker or CLI command needs to know about its environment."""

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    workspace: Path = field(default_factory=Path.cwd)
    allow_shell: bool = False
    """FLEET_ALLOW_SHELL=1; a preset must also allow `bash`."""
    agents_dir: Path | None = None
    skills_dir: Path | None = None
    config_path: Path | None = None
    model: str | None = None
    inject_every_turns: int = 10
    """Every this many turns the plan and active collaborators are re-injected."""
    doom_loop_repeats: int = 3
    lease_ttl_ms: int = keys.LEASE_TTL_MS
    """FLEET_LEASE_TTL_MS: a runner whose heartbeat stops is presumed dead this long after."""
    sweep_interval_s: float = 1.0
    """FLEET_SWEEP_INTERVAL_S: how often each worker looks for lapsed leases and lost spawns."""
    no_worker_timeout_s: float = 30.0
    """FLEET_NO_WORKER_TIMEOUT_S: `fleet run`/`Fleet.wait` give up (exit 2, trace left
    resumable) when no live worker has consumed the queue the trace waits on for this long."""
    summary_chars: int = 400
    """How much of a child's answer goes into its collaborator summary."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read FLEET_* variables; the mapping is kept for model/provider lookup."""
        env = dict(os.environ if env is None else env)
        redis_url = env.get("FLEET_REDIS_URL", DEFAULT_REDIS_URL)
        return cls(
            redis_url=redis_url,
            broker_url=env.get("FLEET_BROKER_URL", redis_url),
            workspace=Path(env.get("FLEET_WORKSPACE") or Path.cwd()).expanduser(),
            allow_shell=env.get("FLEET_ALLOW_SHELL", "") in ("1", "true", "yes"),
            agents_dir=_path(env.get("FLEET_AGENTS_DIR")),
            skills_dir=_path(env.get("FLEET_SKILLS_DIR")),
            config_path=_path(env.get("FLEET_CONFIG")),
            model=env.get("FLEET_MODEL") or None,
            lease_ttl_ms=int(env.get("FLEET_LEASE_TTL_MS", keys.LEASE_TTL_MS)),
            sweep_interval_s=float(env.get("FLEET_SWEEP_INTERVAL_S") or 1.0),
            no_worker_timeout_s=float(env.get("FLEET_NO_WORKER_TIMEOUT_S") or 30.0),
            env=env,
        )

    def with_workspace(self, workspace: Path) -> Settings:
        """A copy whose workspace is checked to be a readable directory."""
        return replace(self, workspace=check_workspace(workspace))


def check_workspace(path: Path) -> Path:
    """The absolute workspace, or `ConfigError` if it is not a readable directory."""
    resolved = path.expanduser().resolve()
    if not resolved.is_dir():
        raise ConfigError(f"workspace {str(path)!r} is not a directory")
    if not os.access(resolved, os.R_OK | os.X_OK):
        raise ConfigError(f"workspace {str(path)!r} is not readable")
    return resolved


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None
