"""Follow the README's first hour from a fresh clone, literally, and say where it breaks.

    python -m bench.first_hour [--repo PATH] [--keep]

A fresh `git clone` of the repository (its committed state) into a temporary folder, a
temporary HOME (so `~/fleet-hour` and `~/.local/state` are this run's alone) and an
environment without any FLEET_* variable. Then, as a newcomer would:

1. `make demo` in the clone;
2. terminal 1: the first-hour block's lines up to `fleet up`, run as written by bash;
3. once it printed `ready`, terminal 2: the block's other lines, run as written by one
   bash (`set -e`), with the README's Python snippet saved where the block runs it
   (`hour.py`, run from a second folder below the `fleet up` folder with no exports);
4. Ctrl-C to terminal 1.

Every step must exit 0; no step may say it fell back to the default Redis (the one line
`fleet.discovery` prints); every root submitted must be in the fleet's own Redis (the
`up.json` of the `fleet up`), so nothing went to another. Prints one line per step with its
time, and exits 0 only when everything held.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"\bready in\b")
FELL_BACK = "no `fleet up` for"
READY_TIMEOUT_S = 180.0
STEP_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Hour:
    """The README's first hour: terminal 1's lines, terminal 2's lines, the Python snippet."""

    terminal1: list[str]
    terminal2: list[str]
    snippet: str
    snippet_name: str


def read_hour(readme: str) -> Hour:
    """The first-hour section's bash block (split at `fleet up`) and its Python block."""
    section = readme.split("## The first hour", 1)[1].split("\n## ", 1)[0]
    bash = re.search(r"```bash\n(.*?)```", section, re.S)
    python = re.search(r"```python\n(.*?)```", section, re.S)
    name = re.search(r"with `~/fleet-hour/app/([\w.]+)`", section)
    if not (bash and python and name):
        raise SystemExit("README: the first hour needs a bash block, a python block and its file")
    lines = [line for line in bash.group(1).splitlines() if line.strip()]
    up = next(i for i, line in enumerate(lines) if line.startswith("fleet up"))
    setup = lines[:up]
    return Hour(setup + [lines[up]], setup + lines[up + 1 :], python.group(1), name.group(1))


def environment(home: Path) -> dict[str, str]:
    """This process's environment without fleet settings, in a HOME of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "FLOWER_"))}
    env.pop("XDG_STATE_HOME", None)
    env.pop("VIRTUAL_ENV", None)
    return {**env, "HOME": str(home)}


def step(name: str, started_s: float, ok: bool, detail: str = "") -> bool:
    mark = "ok  " if ok else "FAIL"
    print(f"{mark} {name:<44} {time.monotonic() - started_s:6.1f} s {detail}".rstrip(), flush=True)
    return ok


def run_make_demo(clone: Path, env: dict[str, str]) -> bool:
    started = time.monotonic()
    done = subprocess.run(
        ["make", "demo"], cwd=clone, env=env, capture_output=True, text=True, timeout=STEP_TIMEOUT_S
    )
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    ok = done.returncode == 0 and FELL_BACK not in done.stderr
    return step("make demo", started, ok, "" if ok else " | ".join(tail))


def start_terminal1(hour: Hour, clone: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    script = "set -e\n" + "\n".join(hour.terminal1) + "\n"
    return subprocess.Popen(
        ["bash", "-c", script],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_ready(up: subprocess.Popen[str], log: list[str]) -> bool:
    """Until terminal 1 printed `ready in`; its output goes on into `log` (a reader thread)."""
    started = time.monotonic()
    stream = up.stdout
    assert stream is not None
    threading.Thread(target=lambda: log.extend(stream), daemon=True).start()
    while time.monotonic() - started < READY_TIMEOUT_S and up.poll() is None:
        if any(READY.search(line) for line in list(log)):
            return step("terminal 1: fleet up (ready)", started, True)
        time.sleep(0.2)
    return step("terminal 1: fleet up (ready)", started, False, "".join(log)[-300:])


def run_terminal2(hour: Hour, clone: Path, env: dict[str, str], home: Path) -> tuple[bool, str]:
    project = home / "fleet-hour" / "app"
    project.mkdir(parents=True, exist_ok=True)
    (project / hour.snippet_name).write_text(hour.snippet)
    lines = ["set -e"]
    for line in hour.terminal2:
        lines += [f"echo '>>> {line.split('#')[0].strip()}' >&2", line]
    lines.append('echo "serve: $(jobs -p)"')
    started = time.monotonic()
    out, err = home / "terminal2.out", home / "terminal2.err"
    # Files, not pipes: `fleet serve ... &` keeps its terminal's output open after bash ends.
    with out.open("w") as stdout, err.open("w") as stderr:
        code = subprocess.run(
            ["bash", "-c", "\n".join(lines)],
            cwd=clone,
            env=env,
            stdout=stdout,
            stderr=stderr,
            timeout=STEP_TIMEOUT_S,
        ).returncode
    said, errors = out.read_text(), err.read_text()
    output = said + errors
    ok = code == 0 and FELL_BACK not in output
    ok = ok and any(line.startswith("completed ") for line in said.splitlines())
    last = [line for line in errors.splitlines() if line.startswith(">>> ")][-1:]
    step(
        "terminal 2: " + str(len(hour.terminal2)) + " lines",
        started,
        ok,
        "" if ok else " ".join(last),
    )
    if not ok:
        print(output[-2000:])
    return ok, output


def check_the_fleets_redis(home: Path, output: str) -> bool:
    """Every root the hour submitted is in the Redis the `fleet up` wrote in its up.json."""
    from fleet.storage.backends.redis.store import RedisStore

    started = time.monotonic()
    states = list((home / ".local" / "state" / "agent-fleet").glob("*/up.json"))
    if not states:
        return step("the fleet's Redis holds the roots", started, False, "no up.json")
    url = json.loads(states[0].read_text())["redis_url"]
    with RedisStore.from_url(url) as store:
        roots = {t.trace_id for t in store.list_traces(100) if t.parent_trace_id is None}
    submitted = set(re.findall(r"^submitted (\S+)$", output, re.M))
    # fleet run's root and hour.py's (the demo ran on a fleet of its own, now stopped).
    ok = len(roots) >= 2 and bool(submitted) and submitted <= roots
    detail = f"{len(roots)} roots there, `fleet run`'s among them: {submitted <= roots}"
    return step("the fleet's Redis holds the roots", started, ok, detail)


def serve_answers(output: str) -> bool:
    started = time.monotonic()
    import httpx

    try:
        ok = httpx.get("http://127.0.0.1:8600/api/traces", timeout=5).status_code == 200
    except httpx.HTTPError:
        ok = False
    for pid in re.findall(r"serve: ([\d ]+)", output)[-1:]:
        for one in pid.split():
            try:
                os.kill(int(one), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
    return step("fleet serve answered on :8600", started, ok)


def stop_terminal1(up: subprocess.Popen[str]) -> bool:
    started = time.monotonic()
    os.killpg(up.pid, signal.SIGINT)
    try:
        code = up.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait()
        code = -9
    return step("terminal 1: Ctrl-C", started, code in (0, 130), f"exit {code}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=ROOT)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    base = Path(tempfile.mkdtemp(prefix="first-hour-"))
    home, clone = base / "home", base / "clone"
    home.mkdir()
    env = environment(home)
    began = time.monotonic()
    up: subprocess.Popen[str] | None = None
    try:
        subprocess.run(["git", "clone", "--quiet", str(args.repo), str(clone)], check=True)
        hour = read_hour((clone / "README.md").read_text())
        results = [run_make_demo(clone, env)]
        up = start_terminal1(hour, clone, env)
        log: list[str] = []
        results.append(wait_ready(up, log))
        if results[-1]:
            ok, stdout = run_terminal2(hour, clone, env, home)
            results += [ok, serve_answers(stdout), check_the_fleets_redis(home, stdout)]
        results.append(stop_terminal1(up))
        up = None
    finally:
        if up is not None and up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    held = all(results)
    took_s = time.monotonic() - began
    print(f"{'held' if held else 'did NOT hold'}: {len(results)} steps in {took_s:.0f} s")
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
