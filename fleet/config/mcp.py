"""The `mcp_servers:` section of fleet.yaml: which MCP servers the operator lets agents use.

    mcp_servers:
      git:                                  # stdio: the fleet starts the server
        command: mcp-server-git
        args: [--repository, /srv/repo]
        env: {GITHUB_TOKEN: FLEET_MCP_GITHUB_TOKEN}   # server variable: worker variable
        env_values: {GIT_PAGER: cat}                  # plain values, no secrets
        read_only: [git_status, git_log]    # read-only whatever the server's hints say
      docs:                                 # streamable HTTP
        url: https://mcp.example.com/mcp
        headers_env: {Authorization: FLEET_MCP_DOCS_AUTH}

A stdio server gets an environment built from this entry alone (plus the SDK's few safe
defaults: PATH, HOME, USER, SHELL, TERM, LOGNAME), never the worker's whole environment:
a secret reaches it only through a worker variable the operator names in `env`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fleet.errors import ConfigError

SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?![_]|$)){0,31}$")
"""A server's name: part of `mcp__SERVER__TOOL`, so no `__` inside it and no `_` at its end."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class McpServerConfig(BaseModel):
    """One entry of `mcp_servers`: a stdio `command` or a streamable HTTP `url`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = Field(default=None, min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    """Server variable -> the worker variable whose value it gets (secrets go here)."""
    env_values: dict[str, str] = Field(default_factory=dict)
    """Server variable -> a plain value."""
    cwd: str = "/"
    """Where a stdio server starts: never the worker's own directory, which is a workspace
    (`python -m` would import a module an agent planted there)."""
    url: str | None = None
    headers_env: dict[str, str] = Field(default_factory=dict)
    """HTTP header -> the worker variable holding its value (`Bearer ...`)."""
    read_only: frozenset[str] = frozenset()
    """Tools the operator vouches for as read-only, whatever `readOnlyHint` says."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (stdio) or url (streamable HTTP)")
        if self.url is not None and (self.args or self.env or self.env_values or self.cwd != "/"):
            raise ValueError("args, env, env_values and cwd are for stdio servers (command)")
        if self.command is not None and self.headers_env:
            raise ValueError("headers_env is for HTTP servers (url)")
        return self

    @property
    def transport(self) -> str:
        """`stdio` or `http`."""
        return "stdio" if self.command is not None else "http"


def check_servers(source: str, servers: Mapping[str, McpServerConfig]) -> None:
    """Names, variables and URLs of every declared server.

    Raises:
        ConfigError: one line, `<file>: mcp_servers.<name>...: <what>`.
    """
    for name, server in servers.items():
        where = f"{source}: mcp_servers.{name}"
        if not SERVER_NAME.match(name):
            raise ConfigError(f"{where}: a server name is letters, digits, - and single _")
        _check_names(where, server)
        if server.url is not None:
            _check_url(where, server.url)


def _check_names(where: str, server: McpServerConfig) -> None:
    for field, names in (("env", server.env), ("env_values", server.env_values)):
        for key in names:
            if not _ENV_NAME.match(key):
                raise ConfigError(f"{where}.{field}: invalid variable name {key!r}")
    for key, variable in {**server.env, **server.headers_env}.items():
        if not _ENV_NAME.match(variable):
            raise ConfigError(f"{where}: {key!r}: invalid worker variable {variable!r}")
    for header in server.headers_env:
        if not _HEADER_NAME.match(header):
            raise ConfigError(f"{where}.headers_env: invalid header name {header!r}")


def _check_url(where: str, url: str) -> None:
    """HTTPS anywhere; plain HTTP only to this machine (headers may carry a secret)."""
    parsed = urlparse(url)
    if parsed.scheme == "https" and parsed.hostname:
        return
    if parsed.scheme == "http" and parsed.hostname and _loopback(parsed.hostname):
        return
    # The URL itself is not quoted: it may hold a user and password.
    raise ConfigError(f"{where}.url: use https:// (plain http only to localhost)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
