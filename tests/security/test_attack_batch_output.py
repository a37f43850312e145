"""Route: a provider's batch output file as an attacker writes it.

Attack: the output lines of one batch carry `"prompt_tokens": NaN`, `Infinity`, `1e300`, a
line nested 200,000 brackets deep, a line over the per-line cap, a line that is not JSON,
garbage bytes, and an answer for a custom id that is not ours; or the file is 150 MiB. On
main `fleet.batch_poll` raised on every poll (ValueError from NaN, RecursionError from the
nesting) and every tree with a call in that batch waited for the provider to change its
answer; the whole file was read into memory (three copies of it: bytes, text, lines).
Control: `fleet.batchapi.lines` streams the file one capped line at a time; a bad line is
its call's error (retried as docs/batch.md says), a foreign one answers nothing.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fleet.llm.base
from fleet.batchapi.lines import LINE_MAX_BYTES
from fleet.batchapi.poller import poll_once
from fleet.batchapi.providers import provider_for
from fleet.loop.runner import Runner
from fleet.models import Trace
from fleet.runtime import Runtime
from fleet.storage.backends.memory.store import MemoryStore
from fleet.storage.store import TraceStore
from tests.fake_batch import AnthropicBatchServer, BatchServer, OpenAIBatchServer
from tests.test_batchapi import LIVE_CALL_USD, SCRIPT, runtime_for, submit

FOREIGN = "fc" + "0" * 40 + "-1"
"""A custom id no call of ours has (ours are `fc` + 40 hex digits + `-attempt`)."""


@pytest.fixture
def allow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)  # loopback only
    yield


def _usage(line: dict[str, Any], number: str) -> bytes:
    """The line with its first usage count replaced by `number` (raw JSON text)."""
    text = json.dumps(line)
    for field in ('"prompt_tokens": 100', '"input_tokens": 100'):
        text = text.replace(field, field.split(":")[0] + ": " + number)
    return text.encode()


def _foreign(line: dict[str, Any]) -> bytes:
    text = json.dumps(line | {"custom_id": FOREIGN})
    return text.replace("done: ", "FOREIGN done: ").replace("list_dir", "bash").encode()


def _poisoned(lines: list[dict[str, Any]]) -> Iterable[bytes]:
    """The first six answers spoiled six ways; the rest as sent; foreign and garbage lines."""
    ids = [line["custom_id"] for line in lines]
    bad = [
        _usage(lines[0], "NaN"),
        _usage(lines[1], "Infinity"),
        _usage(lines[2], "1e300"),
        b'{"custom_id": "%s", "response": ' % ids[3].encode()
        + b"[" * 200_000
        + b"]" * 200_000
        + b"}",
        b'{"custom_id": "%s", "response": {"body": "' % ids[4].encode()
        + b"x" * (LINE_MAX_BYTES + 1024)
        + b'"}}',
        b'{"custom_id": "%s", "response": {oops' % ids[5].encode(),
    ]
    good = [json.dumps(line).encode() for line in lines[6:]]
    junk = [_foreign(lines[6]), b"\x00\xff not json at all", b"[" * 200_000]
    for line in [*bad, *junk[:2], *good, junk[2]]:
        yield line + b"\n"


def _drive(runtime: Runtime, traces: list[Trace], polls: int = 200) -> list[Trace]:
    """Park every trace, then poll and run what each poll resumes until all have ended."""
    providers = provider_for(runtime.config, {})
    for trace in traces:
        assert Runner(runtime).run(trace.trace_id).outcome == "parked"
    try:
        for _ in range(polls):
            for resumed in poll_once(runtime, providers).resume:  # never raises
                Runner(runtime).run(resumed)
            ended = [runtime.store.get_trace(t.trace_id) for t in traces]
            if all(t.is_terminal for t in ended):
                return ended
            time.sleep(0.03)
        return [runtime.store.get_trace(t.trace_id) for t in traces]
    finally:
        providers.close()


def _server(kind: str) -> BatchServer:
    server_type = OpenAIBatchServer if kind == "openai" else AnthropicBatchServer
    return server_type(SCRIPT, delay_s=0.05)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_hostile_lines_are_their_calls_errors_and_the_rest_is_answered(
    kind: str, allow: None, tmp_path: Path, caplog: pytest.LogCaptureFixture, store: TraceStore
) -> None:
    with _server(kind) as server:
        runtime = runtime_for(store, server, tmp_path, kind)  # memory, fakeredis, real Redis
        traces = [submit(runtime, f"task {i}") for i in range(8)]
        server.tamper_next(_poisoned)
        ended = _drive(runtime, traces)
    assert [t.status for t in ended] == ["completed"] * 8, [t.error for t in ended]
    assert [t.answer for t in ended] == [f"done: task {i}" for i in range(8)]
    assert server.live_calls == 0
    # The six spoiled calls were sent again (attempt 2): 8 first turns + 6 + 8 second turns.
    assert len(server.sent) == 22 == len(set(server.sent)), server.sent
    assert FOREIGN not in server.sent
    # Logged as counts: 1 foreign line, 2 unreadable ones (garbage bytes, nesting, no id).
    assert "1 answer lines for calls not in it and 2 unreadable lines ignored" in caplog.text
    assert FOREIGN not in caplog.text and "FOREIGN" not in caplog.text
    for trace in ended:  # the foreign answer (a bash call) reached no trace; costs add up
        assert trace.stats.cost_usd == pytest.approx(2 * LIVE_CALL_USD / 2)
        messages = runtime.store.messages(trace.trace_id)
        assert not any(
            "FOREIGN" in str(m.content) or m.tool_calls and "bash" in str(m.tool_calls)
            for m in messages
        )


def _huge(lines: list[dict[str, Any]]) -> Iterable[bytes]:
    """150 MiB: the real answers between 140 foreign lines of 1 MiB and one of 10 MiB."""
    pad = b"y" * (1024 * 1024)
    foreign = b'{"custom_id": "%s", "response": {"body": "%s"}}\n' % (FOREIGN.encode(), pad)
    for _ in range(70):
        yield foreign
    for line in lines:
        yield json.dumps(line).encode() + b"\n"
    yield b'{"custom_id": "%s", "pad": "' % FOREIGN.encode()
    for _ in range(10):
        yield pad
    yield b'"}\n'
    for _ in range(70):
        yield foreign


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_150_mib_output_file_is_read_in_bounded_memory(
    kind: str, allow: None, tmp_path: Path
) -> None:
    with _server(kind) as server:
        runtime = runtime_for(MemoryStore(), server, tmp_path, kind)
        traces = [submit(runtime, f"task {i}") for i in range(3)]
        server.tamper_next(_huge)
        peak = _peak_of(lambda: _drive(runtime, traces))
        ended = [runtime.store.get_trace(t.trace_id) for t in traces]
    assert [t.status for t in ended] == ["completed"] * 3, [t.error for t in ended]
    assert len(server.sent) == 6  # nothing was retried: every answer was read
    print(f"\npeak traced memory while polling a 150 MiB {kind} output: {peak / 2**20:.1f} MiB")
    assert peak < 4 * LINE_MAX_BYTES, peak


def _peak_of(work: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 7, 64])
def test_lines_split_the_same_at_any_chunk_size_and_long_ones_come_cut(chunk_bytes: int) -> None:
    from fleet.security.capped import Oversized, capped_lines

    data = b'a\n\n{"custom_id": "fc1-1", "x": "' + b"z" * 40 + b'"}\nlast'
    chunks = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
    lines = list(capped_lines(chunks, max_bytes=30))
    assert lines[:2] == [b"a", b""] and lines[3] == b"last"
    assert isinstance(lines[2], Oversized) and lines[2].head.startswith(b'{"custom_id": "fc1-1"')
    assert lines[2].tail.endswith(b'z"}') and lines[2].size_bytes == 71


class _Blob:
    """A provider answering every GET with `status` and `size_bytes` of JSON-ish bytes."""

    def __init__(self, status: int, size_bytes: int) -> None:
        from http.server import BaseHTTPRequestHandler

        from tests.loopback import LoopbackServer

        blob = b'{"id": "' + b"a" * size_bytes + b'"}'

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(blob)))
                self.end_headers()
                self.wfile.write(blob)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.http = LoopbackServer(Handler)


@pytest.mark.parametrize(("status", "size_bytes"), [(200, 9 * 1024 * 1024), (400, 1024 * 1024)])
def test_a_huge_status_or_error_answer_is_refused_in_one_line(
    allow: None, tmp_path: Path, status: int, size_bytes: int
) -> None:
    from fleet.batchapi.providers import OpenAIBatch
    from fleet.errors import FleetError
    from tests.test_batchapi import target

    blob = _Blob(status, size_bytes)
    try:
        provider = OpenAIBatch(target(blob.http, "openai"), "sk-x", {})  # type: ignore[arg-type]
        tracemalloc.start()
        try:
            with pytest.raises(FleetError) as caught:
                provider.phase("b1")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        provider.close()
    finally:
        blob.http.stop()
    message = str(caught.value)
    assert "\n" not in message and len(message) < 600, message[:300]
    assert peak < 3 * LINE_MAX_BYTES
