"""One frozen settings object, read from the environment once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

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
    lease_ttl_ms: int = 20_000
    summary_chars: int = 400
    """How much of a child's answer goes into its collaborator summary."""
    human_timeout_s: int = 24 * 3600
    """FLEET_HUMAN_TIMEOUT_S: how long an `ask_human` question waits before the agent goes on."""
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
            lease_ttl_ms=int(env.get("FLEET_LEASE_TTL_MS", "20000")),
            human_timeout_s=_positive(env, "FLEET_HUMAN_TIMEOUT_S", 24 * 3600),
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


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if not text:
        return default
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(f"{name} must be a whole number of seconds >= 1, got {text!r}")
    return int(text)


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None
