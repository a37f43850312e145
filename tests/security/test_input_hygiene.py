"""Route 11: input hygiene — trace ids, YAML bombs, and terminal escapes in model text.

Attacks (on main):
- `fleet trace show ROOT:messages` read the trace's messages hash as if it were a trace
  and printed a traceback (any id with `:` names another Redis key);
- a 600-byte YAML alias bomb in a batch entry's `metadata` (nine anchors, each nine
  aliases of the one before) expanded to 9**9 values when validated: memory exhausted;
- a model answer with OSC 52 (write the clipboard) and OSC 0 (set the window title)
  reached the terminal raw through `fleet run` and `fleet trace show`.
Controls: `fleet.ids.check_trace_id`, applied in `fleet.storage.keys` (every key built from a trace
id) so the CLI, the API, the client and the tasks all refuse with one line
(`InvalidTraceId`, exit 2); `fleet.security.yamlsafe` (size, depth and alias expansion checked on
the composed node graph before anything is constructed) for batch files, presets,
fleet.yaml and scripts; `fleetops.cli.output.printable`/`dumps` on everything printed.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet.errors import TraceNotFound
from fleet.storage.backends.redis.store import RedisStore
from fleet.testing import ScriptedModel

FLEET = [sys.executable, "-m", "fleetops.cli.main"]
MEMORY_LIMIT_BYTES = 1 << 30


def _cli(
    args: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """The CLI in a subprocess with 1 GiB of address space: a bomb fails, it cannot swap."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))

    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    return subprocess.run(
        [*FLEET, *args],
        env={**clean, **env},
        cwd=cwd,
        capture_output=True,
        timeout=timeout_s,
        preexec_fn=limit,
    )


def _one_line_error(result: subprocess.CompletedProcess[bytes], what: str) -> None:
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "Traceback" not in err
    assert err.startswith("fleet: error: ") and err.count("\n") == 1, err
    assert what in err


@pytest.mark.integration
@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "show", "{root}:messages"],
        ["trace", "show", "--json", "{root}:stats"],
        ["watch", "{root}:events"],
        ["stop", "fleet:*"],
    ],
)
def test_a_trace_id_naming_another_key_is_refused(
    redis_url: str, tmp_path: Path, argv: list[str]
) -> None:
    from fleet.conversation.roots import TaskSpec, create_root
    from fleet.inprocess import InProcessDispatcher
    from fleet.runtime import Runtime
    from fleet.settings import Settings

    settings = Settings.from_env({"FLEET_REDIS_URL": redis_url, "FLEET_WORKSPACE": str(tmp_path)})
    store = RedisStore.from_url(redis_url)
    model = ScriptedModel(["unused"])
    runtime = Runtime.build(settings, store, InProcessDispatcher(), clients={"m": model})
    root = create_root(runtime, TaskSpec("hello", "m"))
    args = [a.replace("{root}", root.trace_id) for a in argv]
    result = _cli(args, {"FLEET_REDIS_URL": redis_url}, tmp_path)
    _one_line_error(result, "invalid trace id")
    assert store.get_trace(root.trace_id).status == "queued", "nothing was touched"
    with pytest.raises(TraceNotFound, match="invalid trace id"):
        store.messages(f"{root.trace_id}:messages")


BOMB = """\
- task: hello
  metadata:
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_a_yaml_alias_bomb_in_batch_metadata_is_refused_at_once(tmp_path: Path) -> None:
    assert len(BOMB) < 600
    (tmp_path / "bomb.yaml").write_text(BOMB)
    started = time.monotonic()
    result = _cli(["batch", "--dry-run", "bomb.yaml"], {}, tmp_path, timeout_s=60)
    assert time.monotonic() - started < 30
    _one_line_error(result, "bomb.yaml:")
    assert "alias" in result.stderr.decode()


def test_json_nested_past_the_recursion_limit_is_one_line(tmp_path: Path) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.jsonl").write_text(
        '{"task": "fine"}\n{"task": "x", "metadata": {"a": ' + deep + "}}\n"
    )
    result = _cli(["batch", "--dry-run", "deep.jsonl"], {}, tmp_path)
    _one_line_error(result, "deep.jsonl:2: invalid JSON: nested too deeply")


def test_anchors_that_share_a_block_still_load(tmp_path: Path) -> None:
    shared = "meta: &m {team: core, owner: ops}\ntasks:\n" + "".join(
        f"  - {{task: t{i}, metadata: *m}}\n" for i in range(50)
    )
    (tmp_path / "ok.yaml").write_text(shared)
    (tmp_path / "m.yaml").write_text("scripts: [{steps: [{content: ok}]}]\n")
    env = {"FLEET_ALLOW_SCRIPTED": "1", "FLEET_WORKSPACE_ROOTS": str(tmp_path)}
    argv = ["batch", "--dry-run", "--model", f"scripted:{tmp_path / 'm.yaml'}", "ok.yaml"]
    result = _cli(argv, env, tmp_path)
    assert result.returncode == 0, result.stderr.decode()


OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"
TITLE = "\x1b]0;sudo make me a sandwich\x1b\\"
CSI = "\x1b[2J\x1b[1;1H"


def test_escape_sequences_from_the_model_never_reach_the_terminal(tmp_path: Path) -> None:
    script = tmp_path / "model.yaml"
    answer = f"done{OSC52} and{TITLE} then{CSI} \x9b31m bidi\u202eevil"
    script.write_text(json.dumps({"scripts": [{"match": ".*", "steps": [{"content": answer}]}]}))
    env = {"FLEET_ALLOW_SCRIPTED": "1", "FLEET_WORKSPACE_ROOTS": str(tmp_path)}
    model = ["--model", f"scripted:{script}"]
    plain = _cli(["run", "--inline", *model, "hi"], env, tmp_path)
    as_json = _cli(["run", "--inline", "--json", *model, "hi"], env, tmp_path)
    assert plain.returncode == 0 and as_json.returncode == 0, plain.stderr + as_json.stderr
    for out in (plain.stdout, as_json.stdout):
        text = out.decode()
        assert not any(c in text for c in "\x1b\x07\x9b\u202e"), repr(text)
    assert plain.stdout.decode().startswith("done and then")
    assert json.loads(as_json.stdout)["answer"] == answer, "JSON keeps the text, escaped"
