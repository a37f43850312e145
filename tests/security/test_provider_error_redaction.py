"""Route 7: a provider that echoes the Authorization / x-api-key header in an error body.

Attack: an OpenAI-compatible server (or an Anthropic one) answers 400/404/500 with a body
quoting the request headers. On main the body's text went into `trace.error` whole, so
`Bearer sk-...` landed in Redis and in `fleet trace show`. Control: `fleet.security.redact` — every
provider text is redacted (the client's key, every secret of the process, auth-header and
key shapes) before it becomes an exception, and `lifecycle.finish` redacts `trace.error`
again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fleet.llm.base
from fleet.inprocess import InProcessFleet
from fleet.settings import Settings
from tests.security.echo import echo_server

OPENAI_KEY = "sk-live-0pen41SECRETvalue1234567890"
ANTHROPIC_KEY = "sk-ant-api03-ANTHR0PICsecret0987654321"


def _fleet(tmp_path: Path, base_url: str) -> InProcessFleet:
    config = tmp_path / "operator" / "fleet.yaml"
    config.parent.mkdir()
    config.write_text(
        "providers:\n"
        f"  evil: {{kind: openai, base_url: '{base_url}/v1', api_key_env: OPENAI_API_KEY}}\n"
        f"  evilant: {{kind: anthropic, base_url: '{base_url}', api_key_env: ANTHROPIC_API_KEY}}\n"
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {
        "OPENAI_API_KEY": OPENAI_KEY,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "FLEET_CONFIG": str(config),
        "FLEET_WORKSPACE": str(workspace),
        "FLEET_WORKSPACE_ROOTS": str(workspace),
        "FLEET_TRANSIENT_RETRIES": "0",  # a 500 fails the run at once, not after re-runs
    }
    return InProcessFleet.from_settings(Settings.from_env(env))


@pytest.mark.parametrize("status", [400, 404, 500])
@pytest.mark.parametrize("model", ["evil:gpt-x", "evilant:claude-x"])
def test_an_echoed_key_never_reaches_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: int, model: str
) -> None:
    monkeypatch.setattr(fleet.llm.base, "ALLOW_MODEL_REQUESTS", True)  # loopback only
    with echo_server(status) as server:
        local = _fleet(tmp_path, server.url)
        trace = local.run("hello", model=model)
    assert server.requests, "the client did reach the attacker's server"
    sent = server.requests[0]
    assert OPENAI_KEY in sent.get("Authorization", "") or ANTHROPIC_KEY in sent.get(
        "x-api-key", ""
    ), "the key was sent (so the echo holds it)"
    assert trace.status == "failed"
    assert f"HTTP {status}" in (trace.error or "")
    stored = local.store.get_trace(trace.trace_id).model_dump_json()
    for key in (OPENAI_KEY, ANTHROPIC_KEY, OPENAI_KEY[8:30], ANTHROPIC_KEY[14:34]):
        assert key not in stored
    assert "[redacted]" in (trace.error or "")


def test_what_a_model_learnt_of_a_secret_is_not_stored(tmp_path: Path) -> None:
    """The model's own output is untrusted too: a child's task, context and a goal it writes
    with a worker secret in them are stored masked (known values of the worker's env)."""
    from fleet.testing import ScriptedModel, call, text

    secret = "wK8pQ2vN7xL4mR9sT1yZ"
    model = ScriptedModel(
        function=lambda messages, tools: (
            text("child done")
            if any("Child" in str(m["content"]) for m in messages if m["role"] == "user")
            else call("agent", task=f"Child: use {secret}", context={"token": secret})
            if sum(m["role"] == "assistant" for m in messages) == 0
            else call("goal", action="add", description=f"leak {secret}")
            if sum(m["role"] == "assistant" for m in messages) == 1
            else text(f"final {secret}")
        )
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    settings = Settings(workspace=workspace, env={"DEPLOY_TOKEN": secret})
    local = InProcessFleet.from_settings(settings, clients={"test": model})
    trace = local.run("start", model="test")
    stored = [local.store.get_trace(trace.trace_id).model_dump_json()]
    stored += [
        local.store.get_trace(c).model_dump_json() for c in local.store.children(trace.trace_id)
    ]
    stored += [m.model_dump_json() for m in local.store.messages(trace.trace_id)]
    assert trace.status == "completed" and len(stored) > 3
    assert all(secret not in text_ for text_ in stored)
    assert "leak [redacted]" in stored[0], "the goal was stored, masked"
    assert "Child: use [redacted]" in stored[1], "the child's task was stored, masked"
