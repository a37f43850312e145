"""The `remote_agents:` section of fleet.yaml: A2A agents a tree may delegate to.

    remote_agents:
      reviewer:
        url: https://review.example.com/a2a     # the agent's JSON-RPC endpoint
        token_env: FLEET_A2A_REVIEWER_TOKEN     # worker variable holding its bearer token
        timeout_s: 600                          # the whole remote task, first send to end
        read_only: true                         # explore/evaluate presets may call it
        private: false                          # true: may be loopback or a private address

Only the operator names a URL: the model names an agent by its key here, never an address
(docs/a2a.md). A preset narrows which of them its traces may call (`remote_agents:
[names]`); a read-only trace may call only those marked `read_only`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleet.errors import ConfigError

AGENT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
"""A remote agent's name: part of `agent://NAME/<task id>`, so a short plain word."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
MAX_TIMEOUT_S = 7 * 86_400


class RemoteAgentConfig(BaseModel):
    """One entry of `remote_agents`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str
    """The agent's A2A JSON-RPC endpoint (http or https; no user:password, no fragment)."""
    token_env: str | None = None
    """The worker variable whose value is sent as `Authorization: Bearer ...`."""
    timeout_s: float = Field(default=600.0, gt=0, le=MAX_TIMEOUT_S)
    """How long one remote task may take, from its first message to its end."""
    read_only: bool = False
    """The operator vouches that the agent changes nothing of ours: read-only traces may call it."""
    private: bool = False
    """The URL may resolve to a loopback or private address (else only public ones)."""

    @field_validator("url")
    @classmethod
    def _plain_url(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url[:80]!r} must be http(s)://HOST/...")
        if parts.username or parts.password or parts.fragment:
            raise ValueError(f"url {url[:80]!r} must carry no user:password and no #fragment")
        return url

    @field_validator("token_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not _ENV_NAME.fullmatch(name):
            raise ValueError(f"token_env {name[:40]!r} is not an environment variable name")
        return name


def check_remote_agents(source: str, agents: Mapping[str, RemoteAgentConfig]) -> None:
    """Every declared agent's name is a plain word.

    Raises:
        ConfigError: one line, `<file>: remote_agents.<name>: <what>`.
    """
    for name in agents:
        if not AGENT_NAME.fullmatch(name):
            shown = name[:40]
            raise ConfigError(f"{source}: remote_agents.{shown!r}: a name is a-z, 0-9, _ and -")
