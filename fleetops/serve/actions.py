"""What the API's acting endpoints share: the fleet client, a JSON body, errors as statuses.

An action is a POST whose body is a JSON object (`{}` when it has no fields) sent as
`Content-Type: application/json`. With the Origin check every request gets (`app.check_request`)
that is the CSRF guard: an HTML form on another site cannot send that type, and a script
there cannot without a CORS preflight, which this server never answers. Auth, Host and body
size are checked in `prepare`, as for every API request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from fleet.errors import (
    BrokerUnavailable,
    ConfigError,
    ConversationError,
    ExperienceNotFound,
)
from fleetops.serve.app import ApiError, ServeConfig, _Base

if TYPE_CHECKING:
    from fleet.client import Fleet

T = TypeVar("T")
JSON_TYPE = "application/json"


class ActionHandler(_Base):
    """A handler with the fleet client and the request's JSON body."""

    fleet: Fleet
    body: bytearray

    def initialize(  # type: ignore[override]
        self, config: ServeConfig, pool: ThreadPoolExecutor, fleet: Fleet
    ) -> None:
        super().initialize(config, pool)
        self.fleet = fleet
        self.body = bytearray()

    def data_received(self, chunk: bytes) -> None:
        """Keep the body: `prepare` refused one over `MAX_BODY_BYTES` before it was read."""
        self.body += chunk

    def fields(self, allowed: frozenset[str]) -> dict[str, Any]:
        """The JSON object posted; `ApiError` 415/400 for another type, shape or field."""
        sent = self.request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if sent != JSON_TYPE:
            raise ApiError(415, f"send actions as {JSON_TYPE} (an empty object {{}} will do)")
        try:
            data = json.loads(self.body or b"{}")
        except ValueError:
            raise ApiError(400, "the body is not JSON") from None
        if not isinstance(data, dict):
            raise ApiError(400, "the body must be a JSON object")
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise ApiError(400, f"unknown field(s) {unknown!r} (known: {sorted(allowed)!r})")
        return data

    def text(self, data: dict[str, Any], name: str, *, required: bool = True) -> str | None:
        """A string field of the body; `ApiError` 400 when missing (if required) or not text."""
        value = data.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or (required and not value.strip()):
            raise ApiError(400, f"field {name!r} must be a non-empty string")
        return value

    async def act(self, fn: Callable[..., T], *args: Any) -> T:
        """`call`, with the fleet's expected refusals as statuses (one line, no traceback)."""
        try:
            return await self.call(fn, *args)
        except ExperienceNotFound as exc:
            raise ApiError(404, str(exc)) from None
        except ConversationError as exc:  # answered already, another call, nothing pending
            raise ApiError(409, str(exc)) from None
        except BrokerUnavailable as exc:
            raise ApiError(503, str(exc)) from None
        except ConfigError as exc:  # a bad scope, an empty rule
            raise ApiError(400, str(exc)) from None
