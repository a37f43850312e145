"""`python -m workers` (`workers.start`): Celery's worker command without the `celery` group.

What the fast start relies on is asserted on Celery 5.7.0 itself (the group's callback and
the worker command), so an upgrade that changes it fails here; a real worker started this
way imports none of the umbrella command's weight and still runs a task.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

import pytest
import redis
from celery.bin import celery as celery_group
from celery.bin import worker as worker_command

from fleet.models import Trace
from fleet.storage.backends.redis.store import RedisStore
from fleetops.cli import ops
from tests.fleetkit import client, fleet_settings
from tests.procs import start_worker, wait_for_workers
from workers import start
from workers.app import app

NOT_AT_START = ("flower", "click_repl", "prompt_toolkit", "tornado", "httpx")
"""Packages only the umbrella command, its plugins, or rarer paths (Batch API) import.
Flower comes as an entry point (not listed), tornado with it (listed)."""


def imported_modules(log: str) -> set[str]:
    """The modules a process imported, from its `-X importtime` lines.

    Not those `importlib.import_module` imports (Celery's loader, entry points): only the
    `import` statements, theirs included.
    """
    return {
        line.rsplit("|", 1)[1].strip()
        for line in log.splitlines()
        if line.startswith("import time:")
    } - {"package"}


def one_completion_model(tmp: Path) -> str:
    path = tmp / "hello.json"
    path.write_text(json.dumps({"scripts": [{"match": ".*", "steps": [{"content": "hello"}]}]}))
    return f"scripted:{path}"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_worker_started_as_a_module_skips_the_umbrella_imports_and_runs_a_task(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = {"FLEET_WORKSPACE": str(tmp_path), "PYTHONPROFILEIMPORTTIME": "1"}
    with start_worker(redis_url, concurrency=2, env_extra=env) as worker:
        assert worker.process.args[1:3] == ["-m", "workers"]  # type: ignore[index]
        wait_for_workers(redis_url, [worker.name], timeout_s=60)
        at_start = imported_modules(worker.log())
        fleet = client(fleet_settings(redis_url, tmp_path))
        trace: Trace = fleet.submit("say hello", model=one_completion_model(tmp_path)).wait(60)
        assert isinstance(fleet.store, RedisStore)
        fleet.store.close()
    assert {"celery.bin.worker", "fleet.models"} <= at_start  # the log was read
    loaded = {name for name in at_start if name.split(".")[0] in NOT_AT_START}
    assert loaded == set()
    assert "celery.bin.celery" not in at_start
    # Hidden while Celery's CLI base and redis-py import: only the refused attempt is listed.
    assert "pygments.lexers" not in at_start
    assert "opentelemetry.sdk.metrics._internal" not in at_start
    assert trace.status == "completed", trace.error


def test_a_bad_option_is_clicks_usage_error_and_detach_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert start.main(["--no-such-option"]) == 2
    assert "No such option '--no-such-option'" in capsys.readouterr().err
    assert start.main(["--detach"]) == 2
    assert "--detach is not supported" in capsys.readouterr().err


def test_fleet_worker_execs_the_module_for_gevent(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        seen.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr("fleetops.cli.ops.os.execve", execve)
    with pytest.raises(SystemExit):
        ops._exec_worker(["worker", "-Q", "fleet.main", "--pool", "gevent"], {})
    assert seen == [[sys.executable, "-P", "-m", "workers", "-Q", "fleet.main", "--pool", "gevent"]]


# What `workers.start` relies on in Celery 5.7.0 (its module docstring says why).


def test_the_celery_group_sets_the_cli_context_and_user_options_start_reproduces() -> None:
    source = inspect.getsource(celery_group.celery.callback)
    assert "ctx.obj = CLIContext(app=app, no_color=no_color, workdir=workdir," in source
    assert "worker.params.extend(ctx.obj.app.user_options.get('worker', []))" in source
    assert "preload_options = ctx.obj.app.user_options.get('preload', ())" in source
    assert "os.environ['CELERY_BROKER_URL'] = broker" in source  # global options: not offered


def test_the_fleet_app_declares_no_worker_or_preload_options() -> None:
    assert not app.user_options["worker"] and not app.user_options["preload"]


def test_the_worker_command_reads_only_app_no_color_quiet_and_error_of_its_context() -> None:
    source = inspect.getsource(worker_command)
    assert set(re.findall(r"ctx\.obj\.(\w+)", source)) == {"app", "no_color", "quiet", "error"}
    assert "['-m', 'celery'] + sys.argv[1:]" in source  # --detach re-executes `celery`


def test_python_m_celery_patches_the_pool_before_the_group_imports() -> None:
    from celery import __main__ as celery_main

    source = inspect.getsource(celery_main.main)
    assert source.index("maybe_patch_concurrency()") < source.index("celery.bin.celery")


def test_celery_bin_base_builds_a_lexer_only_when_pygments_imports() -> None:
    from celery.bin import base

    source = inspect.getsource(base)
    assert "from pygments.lexers import PythonLexer\nexcept ImportError:" in source
    assert "    LEXER = None\n" in source and "highlight(s, LEXER, FORMATTER)" in source
