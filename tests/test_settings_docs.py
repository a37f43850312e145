"""Every environment variable is read into `Settings` and documented in docs/configuration.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.settings import ENV_NAMES, Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fleet", "workers", "fleetops")
NOT_CONFIGURATION = {"FLEET_SHELL_CALL", "FLEET_SUPERVISOR_PID"}
"""Set by the fleet for a child process (bash's marker; `fleet up`'s pid for its workers),
never read as configuration."""


def documented() -> set[str]:
    """The first-column names of the variables table in docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z0-9_]+)`", row.split("|")[1])}


def named_in_code() -> dict[str, str]:
    """Every FLEET_* string constant in the packages, with one place it appears."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if re.fullmatch(r"FLEET_[A-Z0-9_]+", node.value):
                        found.setdefault(node.value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_settings_and_the_documentation_name_the_same_variables() -> None:
    assert set(ENV_NAMES) == documented()
    assert len(ENV_NAMES) == len(set(ENV_NAMES))


def test_no_fleet_variable_is_read_outside_the_settings() -> None:
    stray = {n: where for n, where in named_in_code().items() if n not in ENV_NAMES}
    assert set(stray) <= NOT_CONFIGURATION, stray


def test_every_variable_reaches_its_field() -> None:
    # A value for each name changes the settings: none of them is listed but ignored.
    values = {
        "FLEET_REDIS_URL": "redis://r:1/0",
        "FLEET_BROKER_URL": "amqp://b//",
        "FLEET_REDIS_SENTINEL_MASTER": "fleetmaster",
        "FLEET_WORKSPACE": "/tmp",
        "FLEET_ALLOW_SHELL": "1",
        "FLEET_AGENTS_DIR": "/agents",
        "FLEET_SKILLS_DIR": "/skills",
        "FLEET_CONFIG": "/etc/fleet.yaml",
        "FLEET_MODEL": "openai:m",
        "FLEET_LEASE_TTL_MS": "1234",
        "FLEET_NO_WORKER_TIMEOUT_S": "5",
        "FLEET_TRANSIENT_RETRIES": "7",
        "FLEET_WORKSPACE_ROOTS": "/tmp:/srv",
        "FLEET_ALLOW_SCRIPTED": "1",
        "FLEET_API_KEY_ENVS": "ROUTER_KEY",
        "FLEET_SHELL_ENV": "PROJECT",
        "FLEET_SHELL_USER": "builder",
        "FLEET_SHELL_MAX_PROCS": "64",
        "FLEET_SHELL_MAX_FILE_BYTES": "1000",
        "FLEET_SHELL_CPU_S": "5",
        "FLEET_SHELL_MAX_MEMORY_BYTES": "1000000",
        "FLEET_SHELL_NETWORK": "none",
        "FLEET_WEB_ALLOW": "wiki.internal",
        "FLEET_TOOL_TIMEOUT_S": "7",
        "FLEET_MAX_BRANCHES": "40",
        "FLEET_HUMAN_TIMEOUT_S": "600",
        "FLEET_HOOKS": "audit:HOOKS",
        "FLEET_HOOK_TIMEOUT_S": "0.5",
        "FLEET_EXPERIENCE_AUTO_APPROVE": "execution:project:*",
        "FLEET_SWEEP_INTERVAL_S": "3",
        "FLEET_STUCK_AFTER_S": "7",
        "FLEET_OWNER_CHECK_INTERVAL_S": "2",
        "FLEET_BATCH_POLL_S": "0.5",
        "FLEET_REMOTE_POLL_S": "0.5",
        "FLEET_BATCH_FLUSH_S": "2",
        "FLEET_BATCH_MAX_REQUESTS": "500",
        "FLEET_BATCH_RETRY": "live",
        "FLEET_RETENTION_S": "86400",
        "FLEET_RESULT_BACKEND_URL": "redis://results:6379/0",
        "FLEET_PROBE_DIR": "/probes",
        "FLEET_SERVE_TOKEN": "t" * 20,
        "FLEET_TRACE_URL_TEMPLATE": "http://127.0.0.1:8600/?trace={trace_id}",
        "FLEET_STATE_DIR": "/var/lib/fleet",
        "FLEET_CELERY_PATCHES_OFF": "fleet-join,chord-send",
        "XDG_STATE_HOME": "/var/state",
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
    }
    base = Settings.from_env({})
    for name, value in values.items():
        assert Settings.from_env({name: value}) != base, name
    # A cluster store needs its results elsewhere: the one pair that is set together.
    results = {"FLEET_RESULT_BACKEND_URL": "redis://results:6379/0"}
    assert Settings.from_env({"FLEET_REDIS_CLUSTER": "1", **results}).redis_cluster
    # The OTEL switches that only turn tracing off: set together with one that turns it on.
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert Settings.from_env(on).otel_tracing
    assert Settings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318"}).otel_tracing
    assert not Settings.from_env({**on, "OTEL_SDK_DISABLED": "true"}).otel_tracing
    exercised = {*values, *on, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED"}
    exercised.add("FLEET_REDIS_CLUSTER")
    assert exercised == set(ENV_NAMES)


def test_a_cluster_store_without_a_result_backend_is_one_line() -> None:
    with pytest.raises(ConfigError, match="FLEET_REDIS_CLUSTER=1 needs FLEET_RESULT_BACKEND_URL"):
        Settings.from_env({"FLEET_REDIS_CLUSTER": "1"})
    with pytest.raises(ConfigError, match="FLEET_RESULT_BACKEND_URL must start with redis://"):
        Settings.from_env({"FLEET_RESULT_BACKEND_URL": "amqp://x//"})
    on_the_cluster = {"FLEET_REDIS_URL": "redis://node1:7000/0", "FLEET_REDIS_CLUSTER": "1"}
    on_the_cluster["FLEET_RESULT_BACKEND_URL"] = on_the_cluster["FLEET_REDIS_URL"]
    with pytest.raises(ConfigError, match="names the cluster") as refused:
        Settings.from_env(on_the_cluster)
    assert "\n" not in str(refused.value)
