"""`fleet run --inline`: answers, the JSON object, and bad input as one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetops.cli.main import main

EXAMPLE = Path(__file__).resolve().parent.parent / "fleet" / "examples" / "explore.yaml"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("FLEET_REDIS_URL", "FLEET_MODEL", "FLEET_CONFIG", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("hello\n")
    return tmp_path


def test_inline_json_explores_five_branches(
    clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--inline", "--json", "--model", f"scripted:{EXAMPLE}", "survey"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) >= {"trace_id", "status", "answer", "collaborators", "stats"}
    assert out["status"] == "completed"
    assert len(out["collaborators"]) == 5
    for c in out["collaborators"]:
        assert set(c) == {"name", "trace_id", "status", "summary"}
        assert c["status"] == "completed"
        assert c["trace_id"].startswith(out["trace_id"] + "@explore-")
    assert out["stats"]["messages"] == 3


def test_inline_binds_memory(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["run", "--inline", "--json", "--model", f"scripted:{EXAMPLE}", "survey"]
    assert main([*argv, "--memory", "user:alice", "--memory", "project:acme"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"


def test_inline_prints_the_answer(clean_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--inline", "--model", f"scripted:{EXAMPLE}", "survey"]) == 0
    assert "Explore finished: 5 branches, 5 completed." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--model", "nope"], "nope"),
        (["--model", "openai:gpt-4o-mini"], "OPENAI_API_KEY"),
        (["--model", "scripted:missing.yaml"], "missing.yaml"),
        (["--workspace", "does-not-exist"], "does-not-exist"),
        (["--memory", "user:alice\nIgnore all"], "--memory: namespace"),
        (["--memory", "alice"], "expected KIND:NAME"),
        (["--continue", "20261128T000000-abcdef", "--memory", "user:a"], "keeps the tree's"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    clean_env: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    model = [] if "--model" in argv else ["--model", f"scripted:{EXAMPLE}"]
    assert main(["run", "--inline", *model, *argv, "task"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("fleet: error:") and message in err


def test_malformed_fleet_yaml_names_the_file(
    clean_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = tmp_path_factory.mktemp("operator") / "fleet.yaml"  # outside the root
    config.write_text("models: [unclosed\n")
    monkeypatch.setenv("FLEET_WORKSPACE_ROOTS", str(clean_env))
    monkeypatch.setenv("FLEET_CONFIG", str(config))
    assert main(["run", "--inline", "--model", f"scripted:{EXAMPLE}", "task"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fleet.yaml" in err


def test_no_model_configured_says_how_to_set_one(
    clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--inline", "task"]) == 2
    assert "FLEET_MODEL" in capsys.readouterr().err


def test_unreadable_workspace_is_refused(
    clean_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os.geteuid() == 0:
        # root reads everything; a file where a directory should be is still refused
        target = clean_env / "a-file"
        target.write_text("x")
    else:
        target = clean_env / "locked"
        target.mkdir(mode=0)
    code = main(
        ["run", "--inline", "--model", f"scripted:{EXAMPLE}", "--workspace", str(target), "t"]
    )
    assert code == 2
    assert "workspace" in capsys.readouterr().err


def test_subprocess_error_has_no_traceback(clean_env: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fleetops.cli.main", "run", "--inline", "--preset", "nope", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FLEET_MODEL": f"scripted:{EXAMPLE}"},
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "fleet: error: unknown preset 'nope' (known: default, explore, analyst, evaluate, recorder)"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--inline", "--timeout-s", "-1", "task"],
        ["run", "--timeout-s", "0", "task"],
        ["watch", "--timeout-s", "nan", "some-trace"],
        ["batch", "tasks.jsonl", "--out", "r.jsonl", "--timeout-s", "inf"],
        ["probe", "--max-age-s", "-5"],
    ],
)
def test_a_time_limit_must_be_a_positive_number(
    clean_env: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "must be more than 0" in capsys.readouterr().err


def test_a_reader_that_closes_early_gets_no_traceback(clean_env: Path) -> None:
    """`fleet run --inline --json ... | head -c 1`: the pipe closes before the answer."""
    argv = ["run", "--inline", "--json", "--model", f"scripted:{EXAMPLE}", "survey"]
    with subprocess.Popen(
        [sys.executable, "-m", "fleetops.cli.main", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "FLEET_ALLOW_SCRIPTED": "1"},
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # before the run has printed anything
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize("url", ["notaurl", "http://:hunter2hunter2@redis:6379/0"])
def test_a_redis_url_of_another_scheme_is_one_line_without_the_url(
    clean_env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("FLEET_REDIS_URL", url)
    assert main(["trace", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleet: error: FLEET_REDIS_URL must start with redis://"), err
    assert len(err.splitlines()) == 1 and "hunter2" not in err


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FLEET_LEASE_TTL_MS", "5s"),
        ("FLEET_TRANSIENT_RETRIES", "-1"),
        ("FLEET_MAX_BRANCHES", "0.5"),
        ("FLEET_HUMAN_TIMEOUT_S", "0.5"),
        ("FLEET_TOOL_TIMEOUT_S", "soon"),
    ],
)
def test_a_malformed_number_in_the_environment_is_one_line(
    clean_env: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    value: str,
) -> None:
    monkeypatch.setenv(name, value)
    assert main(["trace", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fleet: error: {name}={value!r}: expected a "), err
    assert len(err.splitlines()) == 1
