"""One frozen settings object, read from the environment once per process.

`process_settings()` is this process's object (workers, the CLI, `Fleet.from_env()`);
`Settings.from_env(env)` builds one from any mapping (tests, `fleet up`'s children).
This module is the one place product code reads `os.environ` (tests/test_imports.py
checks it): `process_env()` is where the settings, the process's redactor and the
launchers that build a child's environment all read it.
Every variable read here is in `ENV_NAMES`, and docs/configuration.md documents each one
(tests/test_settings_docs.py compares the two). A new variable: a field with a docstring,
a line in `from_env`, its name in `ENV_NAMES`, a row in docs/configuration.md.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from fleet.config.shell import SHELL_NETWORKS, ShellLimits
from fleet.errors import ConfigError
from fleet.security import trust
from fleet.security.envvalues import (
    AGENTS_DIR_ENV,
    CONFIG_ENV,
    MODEL_ENV,
    absolute_path,
    agents_dir_of,
    config_path_of,
    is_true,
    model_of,
    name_list,
    positive_s,
    trace_url_template,
    user_path,
    whole_number,
)
from fleet.security.redact import Redactor
from fleet.storage import keys
from fleet.storage.backends.redis.urls import (
    check_url,
    fleet_url,
    result_backend_url,
    sentinel_master,
)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
STATE_HOME_NAME = "agent-fleet"
STATE_KEY_CHARS = 16
"""Hex digits of the directory's hash naming its state folder (64 bits: no collisions)."""
OTEL_CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
OTEL_TRACING_ENVS = (
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)
ENV_NAMES = (
    "FLEET_REDIS_URL",
    "FLEET_BROKER_URL",
    "FLEET_REDIS_SENTINEL_MASTER",
    "FLEET_WORKSPACE",
    "FLEET_ALLOW_SHELL",
    AGENTS_DIR_ENV,
    "FLEET_SKILLS_DIR",
    CONFIG_ENV,
    MODEL_ENV,
    "FLEET_LEASE_TTL_MS",
    "FLEET_NO_WORKER_TIMEOUT_S",
    "FLEET_TRANSIENT_RETRIES",
    trust.WORKSPACE_ROOTS_ENV,
    trust.ALLOW_SCRIPTED_ENV,
    trust.API_KEY_ENVS_ENV,
    "FLEET_SHELL_ENV",
    "FLEET_SHELL_USER",
    "FLEET_SHELL_MAX_MEMORY_BYTES",
    "FLEET_SHELL_MAX_PROCS",
    "FLEET_SHELL_MAX_FILE_BYTES",
    "FLEET_SHELL_CPU_S",
    "FLEET_SHELL_NETWORK",
    "FLEET_WEB_ALLOW",
    "FLEET_TOOL_TIMEOUT_S",
    "FLEET_MAX_BRANCHES",
    "FLEET_HUMAN_TIMEOUT_S",
    "FLEET_HOOKS",
    "FLEET_HOOK_TIMEOUT_S",
    "FLEET_EXPERIENCE_AUTO_APPROVE",
    "FLEET_SWEEP_INTERVAL_S",
    "FLEET_STUCK_AFTER_S",
    "FLEET_OWNER_CHECK_INTERVAL_S",
    "FLEET_BATCH_POLL_S",
    "FLEET_REMOTE_POLL_S",
    "FLEET_BATCH_FLUSH_S",
    "FLEET_BATCH_MAX_REQUESTS",
    "FLEET_BATCH_RETRY",
    "FLEET_RETENTION_S",
    "FLEET_REDIS_CLUSTER",
    "FLEET_RESULT_BACKEND_URL",
    "FLEET_PROBE_DIR",
    "FLEET_SERVE_TOKEN",
    "FLEET_TRACE_URL_TEMPLATE",
    "FLEET_STATE_DIR",
    "FLEET_CELERY_PATCHES_OFF",
    "XDG_STATE_HOME",
    *OTEL_TRACING_ENVS,
    OTEL_CAPTURE_CONTENT_ENV,
)
"""Every environment variable `Settings.from_env` reads (provider keys and base URLs are
read by `fleet.llm.config` from `Settings.env`, named by fleet.yaml)."""


@dataclass(frozen=True)
class Settings:
    """Everything a runner, worker or CLI command needs to know about its environment."""

    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    redis_sentinel_master: str | None = None
    """FLEET_REDIS_SENTINEL_MASTER: the master's name when FLEET_REDIS_URL (or the broker's)
    is a `sentinel://h:p;sentinel://h2:p` URL (see `fleet.storage.backends.redis.urls`)."""
    redis_cluster: bool = False
    """FLEET_REDIS_CLUSTER=1: FLEET_REDIS_URL names a node of a Redis Cluster; the store and
    the limiter use redis-py's cluster client and name keys with hash tags (docs/operations.md)."""
    result_backend_url: str = DEFAULT_REDIS_URL
    """FLEET_RESULT_BACKEND_URL: Celery's result backend (a single Redis); FLEET_REDIS_URL
    unless set, and required apart from it with FLEET_REDIS_CLUSTER=1."""
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
    transient_retries: int = 3
    """FLEET_TRANSIENT_RETRIES: how often a run whose model call failed after the client's
    own retries (5xx, 429, timeouts) is handed back and run again later, before it fails."""
    no_worker_timeout_s: float = 30.0
    """FLEET_NO_WORKER_TIMEOUT_S: `fleet run`/`Fleet.wait` give up (exit 2, trace left
    resumable) when no live worker has consumed the queue the trace waits on for this long."""
    summary_chars: int = 400
    """How much of a child's answer goes into its collaborator summary."""
    workspace_roots: tuple[Path, ...] = ()
    """FLEET_WORKSPACE_ROOTS: every workspace must lie under one (see `fleet.security.trust`).
    Left empty, the only root is `workspace` itself."""
    allow_scripted: bool = False
    """FLEET_ALLOW_SCRIPTED=1: `scripted:FILE` models may load (tests, demos)."""
    api_key_envs: frozenset[str] = frozenset()
    """FLEET_API_KEY_ENVS: `api_key_env` names allowed besides `*_API_KEY`."""
    shell_env: tuple[str, ...] = ()
    """FLEET_SHELL_ENV: variable names bash sees besides PATH, HOME, LANG, TERM, TZ."""
    shell_limits: ShellLimits = field(default_factory=ShellLimits)
    """FLEET_SHELL_USER, FLEET_SHELL_MAX_PROCS, FLEET_SHELL_MAX_FILE_BYTES, FLEET_SHELL_CPU_S,
    FLEET_SHELL_MAX_MEMORY_BYTES, FLEET_SHELL_NETWORK: who bash runs as and what one call
    may use."""
    web_allow: tuple[str, ...] = ()
    """FLEET_WEB_ALLOW: hosts or CIDRs web_fetch may reach although not public."""
    tool_timeout_s: float = 30.0
    """FLEET_TOOL_TIMEOUT_S: wall-clock limit of one tool call."""
    max_branches: int = 1000
    """FLEET_MAX_BRANCHES: most branches one explore call may ask for (a preset may lower it)."""
    human_timeout_s: int = 24 * 3600
    """FLEET_HUMAN_TIMEOUT_S: how long an `ask_human` question waits before the agent goes on."""
    hooks: tuple[str, ...] = ()
    """FLEET_HOOKS: `module:attr` names of `fleet.Hooks` objects every run loads."""
    hook_timeout_s: float = 2.0
    """FLEET_HOOK_TIMEOUT_S: how long one call of an operator's hook may take."""
    experience_auto_approve: tuple[str, ...] = ()
    """FLEET_EXPERIENCE_AUTO_APPROVE: `SOURCE:SCOPE` globs of proposals approved unseen."""
    otel_tracing: bool = False
    """OpenTelemetry configured the standard way (an OTLP endpoint or OTEL_TRACES_EXPORTER,
    and not OTEL_SDK_DISABLED): runs, model and tool calls become spans (`fleet.observe.otel`)."""
    otel_capture_content: bool = False
    """OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true: spans carry prompts,
    completions and tool arguments/results (off by default: they may be sensitive)."""
    sweep_interval_s: float = 1.0
    """FLEET_SWEEP_INTERVAL_S: how often each worker looks for lapsed leases and lost spawns."""
    stuck_after_s: float = 15.0
    """FLEET_STUCK_AFTER_S: how long a tree must be quiet before the owner check walks it."""
    owner_check_interval_s: float = 5.0
    """FLEET_OWNER_CHECK_INTERVAL_S: how often one worker of the fleet runs the owner check."""
    batch_poll_s: float = 30.0
    """FLEET_BATCH_POLL_S: how often one worker of the fleet flushes the provider-batch queue
    and polls the provider batches in flight (`fleet.batchapi`)."""
    remote_poll_s: float = 2.0
    """FLEET_REMOTE_POLL_S: how often a parked remote sub-agent's A2A task is asked about."""
    batch_flush_s: float = 60.0
    """FLEET_BATCH_FLUSH_S: the oldest queued call of a provider waits at most this long
    before its calls are sent as one provider batch (a full batch goes at once)."""
    batch_max_requests: int = 10_000
    """FLEET_BATCH_MAX_REQUESTS: most calls per provider batch (OpenAI takes 50 000, Anthropic
    100 000; a full queue is flushed at once)."""
    batch_retry: Literal["batch", "live"] = "batch"
    """FLEET_BATCH_RETRY: a call that errored inside a provider batch goes into the next batch
    (`batch`) or is made live on a worker (`live`)."""
    retention_s: int = keys.TRACE_TTL_S
    """FLEET_RETENTION_S: how long a finished tree stays in Redis once the owner check compacted
    it (`fleet.storage.backends.redis.compact`); `fleet archive` keeps it longer, outside Redis."""
    probe_dir: Path = Path("/tmp")
    """FLEET_PROBE_DIR: where a worker writes its liveness and readiness files."""
    serve_token: str | None = field(default=None, repr=False)
    """FLEET_SERVE_TOKEN: the bearer token `fleet serve` requires (needed off loopback)."""
    trace_url_template: str | None = None
    """FLEET_TRACE_URL_TEMPLATE: the trace page of a trace id (`{trace_id}` in an http(s)
    URL), shown with each task in Flower."""
    state_home: Path = field(default_factory=lambda: _state_home({}))
    """XDG_STATE_HOME/agent-fleet (default ~/.local/state/agent-fleet): where each local
    `fleet up` keeps its Redis data, logs and `up.json`, one folder per fleet directory."""
    state_dir: Path | None = None
    """FLEET_STATE_DIR: this fleet's state folder, instead of the one under `state_home`."""
    celery_patches_off: tuple[str, ...] = ()
    """FLEET_CELERY_PATCHES_OFF: the Celery/kombu patches a worker and client run without
    (names from `workers.patches`, or `all`; the names are checked where the app is
    configured, which `fleet` does not know)."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.workspace_roots:  # frozen: the one place a default depends on a field
            object.__setattr__(self, "workspace_roots", (self.workspace.resolve(),))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read FLEET_* variables; the mapping is kept for model/provider lookup."""
        env = dict(os.environ if env is None else env)
        redis_url = fleet_url(env.get("FLEET_REDIS_URL", DEFAULT_REDIS_URL), "FLEET_REDIS_URL")
        broker_url = check_url(env.get("FLEET_BROKER_URL", redis_url), "FLEET_BROKER_URL")
        redis_cluster = is_true(env.get("FLEET_REDIS_CLUSTER", ""))
        backend_url = result_backend_url(env, redis_url, redis_cluster)
        workspace = Path(env.get("FLEET_WORKSPACE") or Path.cwd()).expanduser()
        return cls(
            redis_url=redis_url,
            broker_url=broker_url,
            redis_sentinel_master=sentinel_master(env, redis_url, broker_url, backend_url),
            redis_cluster=redis_cluster,
            result_backend_url=backend_url,
            workspace=workspace,
            allow_shell=env.get("FLEET_ALLOW_SHELL", "") in ("1", "true", "yes"),
            agents_dir=agents_dir_of(env),
            skills_dir=user_path(env.get("FLEET_SKILLS_DIR")),
            config_path=config_path_of(env),
            model=model_of(env),
            lease_ttl_ms=whole_number(env, "FLEET_LEASE_TTL_MS", keys.LEASE_TTL_MS),
            no_worker_timeout_s=positive_s(env, "FLEET_NO_WORKER_TIMEOUT_S", 30.0),
            transient_retries=whole_number(env, "FLEET_TRANSIENT_RETRIES", 3, minimum=0),
            # Default: where this process started, and the operator's FLEET_WORKSPACE.
            workspace_roots=trust.parse_roots(
                env.get(trust.WORKSPACE_ROOTS_ENV), (Path.cwd(), workspace)
            ),
            allow_scripted=env.get(trust.ALLOW_SCRIPTED_ENV, "") in ("1", "true", "yes"),
            api_key_envs=trust.allowed_key_envs(env.get(trust.API_KEY_ENVS_ENV)),
            shell_env=name_list(env.get("FLEET_SHELL_ENV")),
            shell_limits=_shell_limits(env),
            web_allow=name_list(env.get("FLEET_WEB_ALLOW")),
            tool_timeout_s=positive_s(env, "FLEET_TOOL_TIMEOUT_S", 30.0),
            max_branches=whole_number(env, "FLEET_MAX_BRANCHES", 1000),
            human_timeout_s=whole_number(env, "FLEET_HUMAN_TIMEOUT_S", 24 * 3600),
            hooks=name_list(env.get("FLEET_HOOKS")),
            hook_timeout_s=positive_s(env, "FLEET_HOOK_TIMEOUT_S", 2.0),
            experience_auto_approve=name_list(env.get("FLEET_EXPERIENCE_AUTO_APPROVE")),
            otel_tracing=_otel_tracing(env),
            otel_capture_content=is_true(env.get(OTEL_CAPTURE_CONTENT_ENV, "")),
            sweep_interval_s=positive_s(env, "FLEET_SWEEP_INTERVAL_S", 1.0),
            stuck_after_s=positive_s(env, "FLEET_STUCK_AFTER_S", 15.0),
            owner_check_interval_s=positive_s(env, "FLEET_OWNER_CHECK_INTERVAL_S", 5.0),
            batch_poll_s=positive_s(env, "FLEET_BATCH_POLL_S", 30.0),
            remote_poll_s=positive_s(env, "FLEET_REMOTE_POLL_S", 2.0),
            batch_flush_s=positive_s(env, "FLEET_BATCH_FLUSH_S", 60.0),
            batch_max_requests=whole_number(env, "FLEET_BATCH_MAX_REQUESTS", 10_000),
            batch_retry=_batch_retry(env.get("FLEET_BATCH_RETRY")),
            retention_s=whole_number(env, "FLEET_RETENTION_S", keys.TRACE_TTL_S),
            probe_dir=Path(env.get("FLEET_PROBE_DIR") or "/tmp"),
            serve_token=env.get("FLEET_SERVE_TOKEN") or None,
            trace_url_template=trace_url_template(env.get("FLEET_TRACE_URL_TEMPLATE")),
            state_home=_state_home(env),
            state_dir=absolute_path(env.get("FLEET_STATE_DIR")),
            celery_patches_off=name_list(env.get("FLEET_CELERY_PATCHES_OFF")),
            env=env,
        )

    def fleet_state_dir(self, directory: Path) -> Path:
        """Where the `fleet up` of `directory` keeps its state.

        FLEET_STATE_DIR when set, else the directory's own folder under `state_home`, named
        by a hash of its real path (so nothing inside the directory says where it is).
        """
        if self.state_dir is not None:
            return self.state_dir
        return state_dir_for(self.state_home, directory)

    @property
    def private_dirs(self) -> tuple[Path, ...]:
        """Folders no file tool opens, whatever the workspace roots say: the fleet's state."""
        return (self.state_home, *([self.state_dir] if self.state_dir else []))

    def with_workspace(self, workspace: Path) -> Settings:
        """A copy whose workspace is checked: a readable directory under a workspace root."""
        return replace(self, workspace=check_workspace(workspace, self.workspace_roots))


def process_env() -> Mapping[str, str]:
    """The process's environment, read-only: the one door to `os.environ`.

    Every other module that needs the raw environment (a launcher copying it into a
    child's, `fleetops.discovery` looking for `FLEET_REDIS_URL`) takes it from here or from
    `Settings.env`; the typed settings are read from it once (`process_settings`).
    """
    return os.environ


@functools.cache
def process_settings() -> Settings:
    """The settings of this process, read from `process_env()` on first use."""
    return Settings.from_env(process_env())


@functools.cache
def process_redactor() -> Redactor:
    """The redactor of this process's own environment, built once on first use.

    For the edges that have no runtime at hand (Celery event fields, task names, log
    records); a runtime carries the one built from its settings. Built from the raw
    environment, not the settings: it must work while reporting that they are invalid.
    """
    return Redactor.from_env(process_env())


def forget_process_settings() -> None:
    """Read the environment again on next use (after a fork or when tests change it)."""
    process_settings.cache_clear()
    process_redactor.cache_clear()


def state_dir_for(state_home: Path, directory: Path) -> Path:
    """The state folder under `state_home` of the fleet whose directory is `directory`."""
    real = str(directory.expanduser().resolve())
    return state_home / hashlib.sha256(real.encode()).hexdigest()[:STATE_KEY_CHARS]


def check_workspace(path: Path, roots: tuple[Path, ...]) -> Path:
    """The absolute workspace, or `ConfigError` if outside `roots` or not a readable dir."""
    resolved = trust.check_workspace_root(path, roots)
    if not resolved.is_dir():
        raise ConfigError(f"workspace {str(path)!r} is not a directory")
    if not os.access(resolved, os.R_OK | os.X_OK):
        raise ConfigError(f"workspace {str(path)!r} is not readable")
    return resolved


def _shell_limits(env: Mapping[str, str]) -> ShellLimits:
    """The FLEET_SHELL_* limits of one bash call; `ConfigError` names a bad one."""
    network = (env.get("FLEET_SHELL_NETWORK") or "host").strip().lower()
    if network not in SHELL_NETWORKS:
        raise ConfigError(f"FLEET_SHELL_NETWORK={network!r}: expected one of {SHELL_NETWORKS}")
    default = ShellLimits()
    return ShellLimits(
        user=(env.get("FLEET_SHELL_USER") or "").strip() or None,
        max_procs=whole_number(env, "FLEET_SHELL_MAX_PROCS", default.max_procs),
        max_file_bytes=whole_number(env, "FLEET_SHELL_MAX_FILE_BYTES", default.max_file_bytes),
        cpu_s=whole_number(env, "FLEET_SHELL_CPU_S", default.cpu_s),
        max_memory_bytes=whole_number(
            env, "FLEET_SHELL_MAX_MEMORY_BYTES", default.max_memory_bytes
        ),
        network=network,
    )


def _batch_retry(text: str | None) -> Literal["batch", "live"]:
    value = (text or "batch").strip()
    if value == "batch":
        return "batch"
    if value == "live":
        return "live"
    raise ConfigError(f"FLEET_BATCH_RETRY={text!r}: expected 'batch' or 'live'")


def _otel_tracing(env: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces to be exported somewhere."""
    if is_true(env.get("OTEL_SDK_DISABLED", "")):
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return bool(exporter or any(env.get(name) for name in endpoints))


def _state_home(env: Mapping[str, str]) -> Path:
    # The XDG base directory spec: a relative XDG_STATE_HOME is invalid and ignored.
    base = Path(env.get("XDG_STATE_HOME") or "")
    if not base.is_absolute():
        base = Path.home() / ".local" / "state"
    return base / STATE_HOME_NAME
