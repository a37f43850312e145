"""Model fallbacks: an alias may name `fallbacks: [alias, ...]` tried when it fails.

    models:
      primary: {provider: openai, name: gpt-4o-mini, fallbacks: [backup]}
      backup: {provider: anthropic, name: claude-haiku-4-5}

A call that still fails after the client's retries (connection refused, 5xx, timeout)
moves the trace to the next alias not tried yet, before any re-run is spent on it: the
trace's `model` becomes the fallback, so every later turn is booked in the fallback's
limit scopes and priced at its prices, each assistant message records the model that
answered it, and the trace's `run.model_fallbacks` lists every switch (`fleet trace show`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from fleet.errors import ConfigError
from fleet.runstate import Fallback

ERROR_CHARS = 200


class _Alias(Protocol):
    @property
    def fallbacks(self) -> list[str]: ...


def check_fallbacks(source: str, models: Mapping[str, _Alias]) -> None:
    """Every fallback is another alias of `models`.

    Raises:
        ConfigError: one line naming the alias and the unknown name.
    """
    for alias, model in models.items():
        for name in model.fallbacks:
            if name == alias or name not in models:
                known = ", ".join(sorted(set(models) - {alias})) or "none"
                raise ConfigError(
                    f"{source}: models.{alias}.fallbacks: {name!r} is not another alias"
                    f" (aliases: {known})"
                )


def next_model(
    models: Mapping[str, _Alias], current: str, tried_before: Sequence[str]
) -> str | None:
    """The alias to try after `current` failed: its first fallback not tried yet.

    `tried_before`: the models the trace moved away from already (`run.model_fallbacks`).
    """
    alias = models.get(current)
    tried = {current, *tried_before}
    return next((name for name in alias.fallbacks if name not in tried), None) if alias else None


def switch_entry(current: str, fallback: str, error: str) -> Fallback:
    """One `run.model_fallbacks` entry; the error cut to one short line."""
    error = " ".join(error.split())[:ERROR_CHARS]
    return Fallback.model_validate({"from": current, "to": fallback, "error": error})
