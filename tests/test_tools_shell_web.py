from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fleet.errors import ToolError
from fleet.tools import sandbox, web
from fleet.tools.base import ToolContext
from fleet.tools.shell import BASE_ENV, bash, shell_env
from fleet.tools.skills import BUILTIN_SKILLS_DIR, available_skills, skill
from fleet.tools.web import html_to_text, web_fetch
from tests.security.attacker import none_left_with, shell_writable

# --- bash --------------------------------------------------------------------------


def shell_ctx(
    workspace: Path, *, output_limit_chars: int = 30_000, bash_timeout_s: float = 60.0
) -> ToolContext:
    return ToolContext(
        workspace=shell_writable(workspace),
        allow_shell=True,
        output_limit_chars=output_limit_chars,
        bash_timeout_s=bash_timeout_s,
    )


def test_bash_refused_without_allow_shell(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"set FLEET_ALLOW_SHELL=1 .* preset that allows bash"):
        bash(ToolContext(workspace=tmp_path), "touch made.txt")
    assert not (tmp_path / "made.txt").exists()


def test_bash_runs_in_the_workspace(tmp_path: Path) -> None:
    result = bash(shell_ctx(tmp_path), "pwd; echo oops >&2; touch made.txt; exit 3")
    assert result.title == "bash exit 3"
    assert result.output.splitlines() == [str(tmp_path), "oops"]
    assert result.metadata == {"exit_code": 3, "timed_out": False}
    assert (tmp_path / "made.txt").exists()


def test_bash_timeout_kills_the_process_group(tmp_path: Path) -> None:
    started = time.monotonic()
    result = bash(shell_ctx(tmp_path), "echo started; sleep 5.417 & sleep 5", 0.5)
    assert time.monotonic() - started < 4
    assert result.is_error
    assert result.title == "bash timed out after 0.5s"
    assert result.output == "started\n"
    assert none_left_with("5.417")


def test_bash_timeout_is_capped_by_the_context(tmp_path: Path) -> None:
    result = bash(shell_ctx(tmp_path, bash_timeout_s=0.3), "sleep 5", timeout_s=100)
    assert result.title == "bash timed out after 0.3s"


def test_bash_output_is_truncated_with_marker(tmp_path: Path) -> None:
    result = bash(shell_ctx(tmp_path, output_limit_chars=100), "printf 'a%.0s' $(seq 1 500)")
    assert result.output == "a" * 100 + "\n… [truncated 400 chars]"
    assert result.title == "bash exit 0"


def test_bash_sees_only_allow_listed_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("FLEET_REDIS_URL", "redis://:hunter2@localhost:6379/0")
    monkeypatch.setenv("HARMLESS", "invisible")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("PROJECT_MODE", "dev")
    ctx = replace(shell_ctx(tmp_path), shell_env=("PROJECT_MODE",))
    result = bash(ctx, "env")
    names = {line.split("=", 1)[0] for line in result.output.splitlines()}
    assert "sk-test" not in result.output and "hunter2" not in result.output
    assert "HARMLESS" not in names
    assert {"PATH", "LANG", "PROJECT_MODE"} <= names
    assert names <= {*BASE_ENV, "PROJECT_MODE", "PWD", "SHLVL", "_", "OLDPWD"}


def test_shell_env_is_an_allow_list() -> None:
    env = {"PATH": "/bin", "GITHUB_TOKEN": "t", "URL": "http://a.b/c", "TZ": "UTC"}
    assert shell_env(env) == {"PATH": "/bin", "TZ": "UTC"}
    assert shell_env(env, ("URL",)) == {"PATH": "/bin", "TZ": "UTC", "URL": "http://a.b/c"}
    assert shell_env({})["PATH"]


# --- web_fetch ---------------------------------------------------------------------

PAGE = b"""<html><head><title>Hello</title><style>body{color:red}</style></head>
<body><h1>Greetings</h1><script>alert('x')</script><p>One &amp; two</p></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        routes = {
            "/page": (200, "text/html; charset=utf-8", PAGE),
            "/plain": (200, "text/plain", b"x" * 10_000),
            "/image": (200, "image/png", b"\x89PNG"),
            "/missing": (404, "text/plain", b"not here"),
        }
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/page")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status, content_type, body = routes[self.path]
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output clean


LOOPBACK = ("127.0.0.1",)
"""The test server is on loopback, which web_fetch refuses unless allowed."""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_web_fetch_html_becomes_text(tmp_path: Path, server: str) -> None:
    result = web_fetch(ToolContext(workspace=tmp_path, web_allow=LOOPBACK), f"{server}/page")
    assert result.output == "Hello\nGreetings\nOne & two"
    assert result.title == f"GET {server}/page -> 200"
    assert not result.is_error


def test_web_fetch_follows_redirects(tmp_path: Path, server: str) -> None:
    result = web_fetch(ToolContext(workspace=tmp_path, web_allow=LOOPBACK), f"{server}/redirect")
    assert result.metadata["final_url"] == f"{server}/page"
    assert "Greetings" in result.output


def test_web_fetch_output_is_capped(tmp_path: Path, server: str) -> None:
    result = web_fetch(
        ToolContext(workspace=tmp_path, web_allow=LOOPBACK, output_limit_chars=100),
        f"{server}/plain",
    )
    assert result.output == "x" * 100 + "\n… [truncated 9900 chars]"


def test_web_fetch_stops_downloading_at_the_byte_cap(
    tmp_path: Path, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web, "MAX_FETCH_BYTES", 1000)
    result = web_fetch(ToolContext(workspace=tmp_path, web_allow=LOOPBACK), f"{server}/plain")
    assert result.output == "x" * 1000 + "\n… [body cut at 1000 bytes]"
    assert result.metadata["cut"] is True


def test_web_fetch_http_error_status_is_an_error_result(tmp_path: Path, server: str) -> None:
    result = web_fetch(ToolContext(workspace=tmp_path, web_allow=LOOPBACK), f"{server}/missing")
    assert result.is_error
    assert result.title.endswith("-> 404")
    assert result.output == "not here"


def test_web_fetch_refuses_binary(tmp_path: Path, server: str) -> None:
    with pytest.raises(ToolError, match=r"'image/png', not text"):
        web_fetch(ToolContext(workspace=tmp_path, web_allow=LOOPBACK), f"{server}/image")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/x", "not a url"])
def test_web_fetch_only_http(tmp_path: Path, url: str) -> None:
    with pytest.raises(ToolError, match=r"not an http:// or https:// address"):
        web_fetch(ToolContext(workspace=tmp_path, web_allow=LOOPBACK), url)


def test_web_fetch_connection_failure(tmp_path: Path, server: str) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = closed.server_address[1]
    closed.server_close()
    with pytest.raises(ToolError, match=r"failed"):
        web_fetch(
            ToolContext(workspace=tmp_path, web_allow=LOOPBACK), f"http://127.0.0.1:{port}/page"
        )


def test_html_to_text_drops_scripts_and_collapses_space() -> None:
    html = "<div>  a\n  b </div><noscript>x</noscript><ul><li>one</li><li>two</li></ul>"
    assert html_to_text(html) == "a b\none\ntwo"


# --- skill -------------------------------------------------------------------------


def test_builtin_planning_skill_loads(tmp_path: Path) -> None:
    result = skill(ToolContext(workspace=tmp_path), "planning")
    assert result.output.startswith("# Planning")
    assert (BUILTIN_SKILLS_DIR / "planning.md").is_file()


def test_project_skills_come_first(tmp_path: Path) -> None:
    (tmp_path / "planning.md").write_text("my planning")
    (tmp_path / "review.md").write_text("my review")
    ctx = ToolContext(workspace=tmp_path, skills_dirs=(tmp_path,))
    assert skill(ctx, "planning").output == "my planning"
    assert skill(ctx, "review").output == "my review"
    assert set(available_skills((tmp_path,))) >= {"planning", "review"}


@pytest.mark.parametrize("name", ["nope", "../planning", "planning.md"])
def test_unknown_skill_lists_available(tmp_path: Path, name: str) -> None:
    with pytest.raises(ToolError, match=r"unknown skill .*\(available: .*planning"):
        skill(ToolContext(workspace=tmp_path), name)


def test_without_namespaces_the_worker_is_non_dumpable_and_strays_are_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where unshare is refused (Docker's default seccomp), the fallback must still hold.
    monkeypatch.setattr(sandbox, "sandbox_prefix", lambda network_off=False: None)
    monkeypatch.setenv("FALLBACK_SECRET", "sk-fallback-secret")
    command = "cat /proc/$PPID/environ; setsid sleep 271.828 >/dev/null 2>&1 & echo ran"
    result = bash(shell_ctx(tmp_path), command)
    assert "ran" in result.output
    assert "sk-fallback-secret" not in result.output
    assert "Permission denied" in result.output
    assert none_left_with("271.828")
