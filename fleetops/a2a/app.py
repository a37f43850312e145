"""The ASGI app of `fleet a2a`: a2a-sdk's JSON-RPC routes and card, behind a bearer token."""

from __future__ import annotations

import hmac
import json
from typing import Any

from fleet.client import Fleet
from fleetops.a2a.card import a2a_presets, agent_card
from fleetops.a2a.executor import FleetExecutor

CARD_PATH = "/.well-known/agent-card.json"
MAX_BODY_BYTES = 1_000_000
"""Most bytes of a request body (declared in Content-Length) a2a-sdk is handed."""


def build_app(fleet: Fleet, url: str, token: str, poll_s: float | None = None) -> Any:
    """The Starlette app: the card (public: it says how to authenticate), JSON-RPC at `/`.

    Every other request without `Authorization: Bearer <token>` is refused with 401, and
    a POST whose declared body is over `MAX_BODY_BYTES` (or undeclared) with 413, before
    a2a-sdk reads a byte of it.
    """
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from starlette.applications import Starlette

    from fleet.storage.a2a_tasks import A2A_TASKS
    from fleetops.a2a.resume import FleetHandler
    from fleetops.a2a.store import RedisTaskStore

    presets = a2a_presets(fleet.runtime.presets)
    card = agent_card(url, presets)
    skills = [p.name for p in presets]
    executor = (
        FleetExecutor(fleet, skills) if poll_s is None else FleetExecutor(fleet, skills, poll_s)
    )
    handler = FleetHandler(
        executor,
        task_store=RedisTaskStore(
            fleet.store.capability(A2A_TASKS), fleet.runtime.settings.retention_s
        ),
        agent_card=card,
    )
    routes = [*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")]
    return _Bearer(Starlette(routes=routes), token)


class _Bearer:
    """ASGI middleware: the token on every request but the card's."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != CARD_PATH:
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await _refuse(send, 401, "a bearer token is required (the card's security scheme)")
                return
            length = headers.get(b"content-length", b"")
            if scope["method"] == "POST" and not _small(length):
                await _refuse(send, 413, f"a request body is at most {MAX_BODY_BYTES} bytes")
                return
        await self.app(scope, receive, send)


def _small(length: bytes) -> bool:
    """A declared length within the cap (a body without one, chunked, is refused)."""
    return length.isdigit() and int(length) <= MAX_BODY_BYTES


async def _refuse(send: Any, status: int, why: str) -> None:
    body = json.dumps({"error": why}).encode()
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
