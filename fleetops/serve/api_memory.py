"""`fleet serve`'s memory endpoints: what `fleet memory` does, as JSON (token + CSRF).

    GET  /api/memory                               {"namespaces": [...]}
    GET  /api/memory/{ns}                          {"entries": [...], "held": [...]}
    GET  /api/memory/{ns}/{key}                    {"entry": {...}}          404: none
    GET  /api/memory/{ns}/{key}/history            {"history": [...]}
    POST /api/memory/{ns}/{key}  {value, expected_version?}  {"version": N}  409: lost
    POST /api/memory/{ns}/{key}/remove  {}         {"removed": key}          404: none
    POST /api/memory/{ns}/approve  {key?}          {"approved": [{key, landed, version}]}

Every name is checked before the store is asked (a bad one is a one-line 400); a write
over a cap is a 400; a compare-and-set that lost is a 409 naming the current version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleet.memory.model import Entry, Landed, WriteOutcome
from fleet.memory.names import check_key, check_namespace
from fleetops.serve.actions import ActionHandler
from fleetops.serve.app import ApiError

if TYPE_CHECKING:
    from fleet.client import Fleet

_MAX_NAME_CHARS = 200


def _data(entry: Entry) -> dict[str, Any]:
    return entry.model_dump(mode="json")


class _MemoryBase(ActionHandler):
    async def names(self, namespace: str, key: str | None = None) -> tuple[str, str | None]:
        """The path's names, checked (400 with one line when malformed)."""
        if len(namespace) > _MAX_NAME_CHARS or len(key or "") > _MAX_NAME_CHARS:
            raise ApiError(400, "memory: namespace or key too long")
        await self.act(check_namespace, namespace)
        if key is not None:
            await self.act(check_key, key)
        return namespace, key


class NamespacesHandler(_MemoryBase):
    """`GET /api/memory`."""

    async def get(self) -> None:
        self.reply({"namespaces": await self.act(self.fleet.memory.namespaces)})


class NamespaceHandler(_MemoryBase):
    """`GET /api/memory/{ns}`: its entries and the writes held for approval."""

    async def get(self, namespace: str) -> None:
        await self.names(namespace)
        memory = self.fleet.memory
        entries = await self.act(memory.entries, namespace)
        held = await self.act(memory.proposals, namespace)
        self.reply({"entries": [_data(e) for e in entries], "held": [p.model_dump() for p in held]})


class EntryHandler(_MemoryBase):
    """`GET` one key; `POST` a compare-and-set write of it."""

    async def get(self, namespace: str, key: str) -> None:
        await self.names(namespace, key)
        entry = await self.act(self.fleet.memory.get, namespace, key)
        if entry is None:
            raise ApiError(404, f"no key {key!r} in {namespace}")
        self.reply({"entry": _data(entry)})

    async def post(self, namespace: str, key: str) -> None:
        await self.names(namespace, key)
        data = self.fields(frozenset({"value", "expected_version"}))
        if "value" not in data:
            raise ApiError(400, "field 'value' is required (any JSON)")
        expected = data.get("expected_version")
        if expected is not None and (not isinstance(expected, int) or isinstance(expected, bool)):
            raise ApiError(400, "field 'expected_version' must be a whole number")
        outcome = await self.act(self.fleet.memory.set, namespace, key, data["value"], expected)
        if not isinstance(outcome, Landed):
            raise ApiError(409, f"{namespace} {key} is at version {_version(outcome)}")
        self.reply({"version": outcome.version})


class HistoryHandler(_MemoryBase):
    """`GET /api/memory/{ns}/{key}/history`: newest first."""

    async def get(self, namespace: str, key: str) -> None:
        await self.names(namespace, key)
        found = await self.act(self.fleet.memory.history, namespace, key)
        self.reply({"history": [_data(e) for e in found]})


class RemoveHandler(_MemoryBase):
    """`POST /api/memory/{ns}/{key}/remove`."""

    async def post(self, namespace: str, key: str) -> None:
        await self.names(namespace, key)
        self.fields(frozenset())
        if not await self.act(self.fleet.memory.remove, namespace, key):
            raise ApiError(404, f"no key {key!r} in {namespace}")
        self.reply({"removed": key})


class ApproveHandler(_MemoryBase):
    """`POST /api/memory/{ns}/approve`: land the recorder's held writes (of one key)."""

    async def post(self, namespace: str) -> None:
        data = self.fields(frozenset({"key"}))
        key = self.text(data, "key", required=False)
        await self.names(namespace, key)
        done = await self.act(self.fleet.memory.approve, namespace, key)
        rows = [
            {
                "key": a.proposal.key,
                "landed": isinstance(a.outcome, Landed),
                "version": _version(a.outcome),
            }
            for a in done
        ]
        self.reply({"approved": rows})


def _version(outcome: WriteOutcome) -> int:
    return outcome.version if isinstance(outcome, Landed) else outcome.current_version


def routes(fleet: Fleet, base: dict[str, Any]) -> list[tuple[str, type, dict[str, Any]]]:
    """The memory endpoints, for `ServeConfig.routes`."""
    kwargs = {**base, "fleet": fleet}
    return [
        (r"/api/memory", NamespacesHandler, kwargs),
        (r"/api/memory/([^/]+)", NamespaceHandler, kwargs),
        (r"/api/memory/([^/]+)/approve", ApproveHandler, kwargs),
        (r"/api/memory/([^/]+)/([^/]+)", EntryHandler, kwargs),
        (r"/api/memory/([^/]+)/([^/]+)/history", HistoryHandler, kwargs),
        (r"/api/memory/([^/]+)/([^/]+)/remove", RemoveHandler, kwargs),
    ]
