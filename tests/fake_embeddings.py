"""A local OpenAI-wire `POST /v1/embeddings` server with deterministic vectors.

    with FakeEmbeddings(key="sk-test-...") as server:
        ... fleet.yaml: providers.emb: {kind: openai, base_url: server.url + "/v1", ...} ...
        server.inputs     # the `input` list of every request, in order

A text's vector counts its words by *concept*: each word is mapped through `CONCEPTS`
(so "schema", "upgrade" and "migration" are one concept, as a real embedding model would
see them) and hashed into one of `DIMENSIONS` slots. Texts about the same concept have a
cosine near 1 without sharing a word; unrelated texts near 0. Like OpenAI it answers 401
without the right bearer key. `mode` turns it broken or hostile.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any, Literal

from tests.loopback import LoopbackServer

DIMENSIONS = 64
CONCEPTS = {
    "schema": "migration",
    "upgrade": "migration",
    "migrations": "migration",
    "database": "migration",
    "db": "migration",
    "changelog": "release",
    "notes": "release",
    "version": "release",
    "shipping": "release",
}
STOPWORDS = frozenset({"a", "an", "the", "it", "is", "of", "to", "when", "then", "fix", "and"})
Mode = Literal[
    "ok", "error500", "throttle", "wrong_count", "nan", "mixed_sizes", "echo_key", "hang"
]
HANG_S = 3.0
"""How long `hang` mode sleeps before it answers."""


def vector(text: str) -> list[float]:
    """The deterministic vector of `text` (see the module docstring)."""
    values = [0.0] * DIMENSIONS
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        if word in STOPWORDS:
            continue
        concept = CONCEPTS.get(word, word)
        slot = int(hashlib.sha256(concept.encode()).hexdigest(), 16) % DIMENSIONS
        values[slot] += 1.0
    if not any(values):
        values[0] = 1.0  # never a zero vector: a real model always answers something
    return values


@dataclass
class FakeEmbeddings:
    """The server; see the module docstring."""

    key: str = ""
    """The bearer key it accepts; empty: any (a local server)."""
    mode: Mode = "ok"
    inputs: list[list[str]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    """The Authorization header of every request."""
    _http: LoopbackServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT` (the provider's base_url is this plus `/v1`)."""
        assert self._http is not None
        return self._http.url

    def texts(self) -> list[str]:
        """Every text embedded so far, in order."""
        with self._lock:
            return [t for batch in self.inputs for t in batch]

    def __enter__(self) -> FakeEmbeddings:
        self._http = LoopbackServer(_handler_for(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._http is not None
        self._http.stop()

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        """Status and JSON body for one POST."""
        request = json.loads(body)
        texts = request.get("input")
        texts = [texts] if isinstance(texts, str) else list(texts)
        with self._lock:
            self.inputs.append(texts)
            self.auth.append(headers.get("authorization", ""))
        if path != "/v1/embeddings":
            return 404, {"error": {"message": f"no route {path}"}}
        if self.key and headers.get("authorization") != f"Bearer {self.key}":
            return 401, {"error": {"message": "Incorrect API key provided"}}
        if self.mode == "hang":
            time.sleep(HANG_S)
        elif self.mode != "ok":
            return _broken(self.mode, texts, self.key)
        data = [{"index": i, "embedding": vector(t)} for i, t in enumerate(texts)]
        data.reverse()  # the index, not the order, says which input a vector is for
        return 200, {"object": "list", "data": data, "model": request.get("model")}


def _broken(mode: Mode, texts: list[str], key: str) -> tuple[int, Any]:
    if mode == "error500":
        return 500, {"error": {"message": "internal error"}}
    if mode == "throttle":
        return 429, {"error": {"message": "rate limited"}}
    if mode == "echo_key":  # an error page quoting the request's key back
        return 400, {"error": {"message": f"bad request from key {key}"}}
    vectors = [vector(t) for t in texts]
    if mode == "wrong_count":
        vectors = vectors[:-1] or [[1.0]]
    elif mode == "nan":
        vectors[0][0] = float("nan")
    else:  # mixed_sizes
        vectors[-1] = vectors[-1] + [1.0]
    data = [{"index": i, "embedding": v} for i, v in enumerate(vectors)]
    return 200, {"data": data}


def _handler_for(fake: FakeEmbeddings) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            body = self.rfile.read(int(headers.get("content-length", "0")))
            status, answer = fake.answer(self.path, headers, body)
            payload = json.dumps(answer).encode()  # NaN goes out as the bare word NaN
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: pytest treats stray output as noise

    return Handler
