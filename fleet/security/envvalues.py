"""Readers of the operator's environment values, each bad value a one-line `ConfigError`.

`fleet.settings` (the one module that reads `os.environ`) reads each variable with these;
they take the mapping it read and never the process's environment themselves. The message
names the variable and quotes its value, so an operator sees which setting to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fleet.errors import ConfigError

CONFIG_ENV = "FLEET_CONFIG"
MODEL_ENV = "FLEET_MODEL"
AGENTS_DIR_ENV = "FLEET_AGENTS_DIR"


def name_list(value: str | None) -> tuple[str, ...]:
    """A comma- or whitespace-separated list of names."""
    return tuple(n for n in (value or "").replace(",", " ").split() if n)


def positive_s(env: Mapping[str, str], name: str, default: float) -> float:
    """`name`'s value in seconds (`default` when unset); `ConfigError` unless it is > 0."""
    text = env.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigError(f"{name}={text!r}: expected a positive number of seconds")
    return value


def whole_number(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    """`name`'s value (`default` when unset); `ConfigError` unless a whole number >= `minimum`."""
    text = (env.get(name) or "").strip()
    if not text:
        return default
    if not text.isdecimal() or int(text) < minimum:
        raise ConfigError(f"{name}={text!r}: expected a whole number >= {minimum}")
    return int(text)


def is_true(value: str) -> bool:
    """1, true or yes, in any case and with spaces around."""
    return value.strip().lower() in ("1", "true", "yes")


def absolute_path(value: str | None) -> Path | None:
    """The path made absolute (`~` expanded), or None when unset."""
    return Path(value).expanduser().absolute() if value else None


def user_path(value: str | None) -> Path | None:
    """The path with `~` expanded, or None when unset."""
    return Path(value).expanduser() if value else None


def config_path_of(env: Mapping[str, str]) -> Path | None:
    """FLEET_CONFIG, the operator's fleet.yaml (`~` expanded); None when unset.

    The one reader of the variable: `Settings.from_env` and `fleet.llm.config.load_config`
    (called without a path) both read it here.
    """
    return user_path(env.get(CONFIG_ENV))


def model_of(env: Mapping[str, str]) -> str | None:
    """FLEET_MODEL, the default model of a run; None when unset or empty (the one reader)."""
    return env.get(MODEL_ENV) or None


def agents_dir_of(env: Mapping[str, str]) -> Path | None:
    """FLEET_AGENTS_DIR, the folder of preset files (`~` expanded); None when unset.

    The one reader: `Settings.from_env` and `fleet.presets.load_presets` without a folder.
    """
    return user_path(env.get(AGENTS_DIR_ENV))


TRACE_ID_FIELD = "{trace_id}"


def trace_url_template(value: str | None) -> str | None:
    """FLEET_TRACE_URL_TEMPLATE: an http(s) URL with `{trace_id}`, or None when unset.

    Raises:
        ConfigError: a template that is not http(s) or names no `{trace_id}`.
    """
    value = (value or "").strip()
    if not value:
        return None
    if not value.startswith(("http://", "https://")) or TRACE_ID_FIELD not in value:
        raise ConfigError(
            f"FLEET_TRACE_URL_TEMPLATE={value!r}: expected an http(s) URL with {TRACE_ID_FIELD}"
            " in it, e.g. http://127.0.0.1:8600/?trace={trace_id}"
        )
    if any(c.isspace() or c in "\"'<>" for c in value):
        raise ConfigError(f"FLEET_TRACE_URL_TEMPLATE={value!r}: no spaces, quotes or brackets")
    return value
