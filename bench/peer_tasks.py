"""The HTTP peer: what a Celery user would write instead of the fleet, loaded with `-I`.

`bench.http_root` makes the root's first completion (which answers with an `agent` call of
N tasks), then sends `chord(N x bench.http_branch, bench.http_summary)` from the worker, as
the fleet's root does. Each branch makes the same two completions as a fleet branch (the
first answers `list_dir`, which it runs; the second answers), with the same system prompt,
task and tool schemas, over one `httpx.Client` per worker process with httpx's defaults
(as `OpenAIClient` uses). The body makes the root's second completion and returns its own
clock. So both columns make the same 2N + 2 completions against the same server.

Kept out of `workers/` on purpose: production workers never register these tasks.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from celery import chord

from fleet.loop.context import BASE_PROMPT
from fleet.presets import BUILTIN_PRESETS
from fleet.tools.registry import default_registry
from workers.app import QUEUE_BY_MODE, app

RETRIES = 3
_lock = threading.Lock()
_http: list[httpx.Client] = []
_TOOLS = default_registry().schemas(["read_file", "glob", "grep", "list_dir"])


def _client() -> httpx.Client:
    with _lock:
        if not _http:
            _http.append(httpx.Client(timeout=120.0))
        return _http[0]


def _complete(base_url: str, model: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "tools": _TOOLS, "tool_choice": "auto"}
    for attempt in range(RETRIES):  # as the fleet's client retries a dropped connection
        try:
            response = _client().post(f"{base_url}/chat/completions", json=body)
            break
        except httpx.TransportError:
            if attempt == RETRIES - 1:
                raise
    response.raise_for_status()
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def _system() -> dict[str, Any]:
    workspace = os.environ.get("FLEET_WORKSPACE", ".")
    prompt = (
        f"{BASE_PROMPT.format(workspace=workspace)}\n\n{BUILTIN_PRESETS['explore'].system_prompt}"
    )
    return {"role": "system", "content": prompt}


@app.task(name="bench.http_root")  # type: ignore[untyped-decorator]
def http_root(base_url: str, model: str, task: str, body_id: str) -> None:
    """The root's first completion, then the chord of branches (body id given by the bench)."""
    messages = [_system(), {"role": "user", "content": task}]
    first = _complete(base_url, model, messages)
    tasks = json.loads(first["tool_calls"][0]["function"]["arguments"])["task"]
    header = [http_branch.si(base_url, model, t).set(queue=QUEUE_BY_MODE["explore"]) for t in tasks]
    body = http_summary.s(base_url, model, task).set(queue=QUEUE_BY_MODE["main"], task_id=body_id)
    chord(header, body).apply_async()


@app.task(name="bench.http_branch")  # type: ignore[untyped-decorator]
def http_branch(base_url: str, model: str, task: str) -> str:
    """Two completions with a `list_dir` run between them, like a fleet branch.

    An error comes back as the answer, as a fleet branch's envelope does: the chord body
    must run whatever a branch met.
    """
    try:
        return _branch(base_url, model, task)
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        return f"error: {type(exc).__name__}: {exc}"


def _branch(base_url: str, model: str, task: str) -> str:
    messages = [_system(), {"role": "user", "content": task}]
    first = _complete(base_url, model, messages)
    call = first["tool_calls"][0]
    workspace = Path(os.environ.get("FLEET_WORKSPACE", "."))
    listing = "\n".join(sorted(p.name for p in workspace.iterdir()))
    messages += [first, {"role": "tool", "tool_call_id": call["id"], "content": listing}]
    return str(_complete(base_url, model, messages)["content"])


@app.task(name="bench.http_summary")  # type: ignore[untyped-decorator]
def http_summary(answers: list[str], base_url: str, model: str, task: str) -> float:
    """The root's second completion over every branch's answer; returns when it ended."""
    messages = [
        _system(),
        {"role": "user", "content": task},
        {"role": "tool", "tool_call_id": "call_0", "content": "\n".join(answers)},
    ]
    _complete(base_url, model, messages)
    return time.time()


@app.task(name="bench.http_once")  # type: ignore[untyped-decorator]
def http_once(base_url: str, model: str, task: str) -> str:
    """One completion of a task, as a one-turn fleet run makes (bench/branch_cost_bench.py)."""
    messages = [_system(), {"role": "user", "content": task}]
    return str(_complete(base_url, model, messages)["content"])
