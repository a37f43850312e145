"""The stdio transport of a server, with every message capped while it is read.

The SDK's `stdio_client` joins a line's chunks by concatenating strings (quadratic: one
64 MiB answer took a minute of CPU and 320 MB) and holds it whole before parsing. Here the
server's stdout is split by `fleet.security.capped.CappedLines` as it arrives: a message
past `MESSAGE_MAX_BYTES` is never held; if its first (or last) bytes name a request id,
that request gets a JSON-RPC error in its place ("answer too big"), so the call ends at
once as a tool error and the server's other calls go on over the same session.

The process runs in its own session (process group); on exit its stdin is closed, then
the group gets SIGTERM, then SIGKILL, each after a short grace (as the SDK does).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from fleet.security.capped import CappedLines, Oversized

if TYPE_CHECKING:
    from mcp import StdioServerParameters
    from mcp.shared.message import SessionMessage

MESSAGE_MAX_BYTES = 8 * 1024 * 1024
"""Largest message read from a server: a result past `tools.MAX_RESULT_CHARS` (1,000,000
characters) is refused anyway, and one that big takes at most ~6 MiB of JSON."""
READ_BYTES = 64 * 1024
STOP_GRACE_S = 2.0
TOO_BIG = -32001
"""The JSON-RPC error code of the answer put in place of one past the cap."""
_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{1,200}")')


@contextlib.asynccontextmanager
async def capped_stdio(
    params: StdioServerParameters, errlog: Any, max_bytes: int = MESSAGE_MAX_BYTES
) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server; the session's read and write streams, as the SDK's transport."""
    from mcp.client.stdio import get_default_environment

    process = await anyio.open_process(
        [params.command, *params.args],
        env=get_default_environment() | (params.env or {}),
        stderr=errlog,
        cwd=params.cwd,
        start_new_session=True,
    )
    reads_in, reads_out = anyio.create_memory_object_stream[Any](0)
    writes_in, writes_out = anyio.create_memory_object_stream[Any](0)
    async with anyio.create_task_group() as group:
        group.start_soon(_read, process, reads_in, max_bytes)
        group.start_soon(_write, process, writes_out, reads_in)
        try:
            yield reads_out, writes_in
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                for stream in (reads_out, writes_in, reads_in, writes_out):
                    await stream.aclose()
            group.cancel_scope.cancel()


async def _read(process: anyio.abc.Process, sink: Any, max_bytes: int) -> None:
    """The server's stdout as messages, each line capped at `max_bytes`."""
    assert process.stdout is not None
    lines = CappedLines(max_bytes)
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        async with sink:
            while True:
                try:
                    chunk = await process.stdout.receive(READ_BYTES)
                except anyio.EndOfStream:
                    break
                for line in lines.feed(chunk):
                    if (message := _message(line, max_bytes)) is not None:
                        await sink.send(message)


async def _write(process: anyio.abc.Process, source: Any, reads: Any) -> None:
    """The session's messages to the server's stdin, one JSON line each."""
    assert process.stdin is not None
    try:
        async with source:
            async for message in source:
                text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send((text + "\n").encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await reads.aclose()  # the session sees the connection end, not a hanging request


def _message(line: bytes | Oversized, max_bytes: int) -> SessionMessage | Exception | None:
    """One line as a message: an oversized one as the error answer of its request."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    if isinstance(line, Oversized):
        request_id = _request_id(line)
        if request_id is None:
            return ValueError(f"a message of {line.size_bytes} bytes without a request id")
        why = f"answer of {line.size_bytes} bytes refused (the most read is {max_bytes})"
        error = mcp_types.ErrorData(code=TOO_BIG, message=why)
        return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
    if not line.strip():
        return None
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line))
    except ValueError as exc:  # the session reports it; its text is the server's: not kept
        return ValueError(f"a message that is not JSON-RPC ({type(exc).__name__})")


def _request_id(line: Oversized) -> int | str | None:
    """The id a too-big answer names at its start (or, failing that, at its end)."""
    found = _ID.search(line.head) or _ID.search(line.tail)
    if found is None:
        return None
    raw = found[1].decode(errors="replace")
    return raw[1:-1] if raw.startswith('"') else int(raw)


async def _stop(process: anyio.abc.Process) -> None:
    """Close stdin, then SIGTERM and SIGKILL the server's process group, each after a grace."""
    if process.stdin is not None:
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    for sent in (None, signal.SIGTERM, signal.SIGKILL):
        if sent is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sent)
        with anyio.move_on_after(STOP_GRACE_S):
            while process.returncode is None:
                await anyio.sleep(0.01)
        if process.returncode is not None:
            break
    if process.stdout is not None:
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdout.aclose()
