"""The benchmark's rows and the issue-14 target table with a verdict per target."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness import load
from bench.runs import Sample

MIB = 1024 * 1024


@dataclass(frozen=True)
class Row:
    """Medians of one configuration: the fleet against its peer chord and asyncio."""

    kind: str
    """`scripted` (peer: chord of sleeps) or `http` (peer: chord of httpx calls)."""
    n: int
    latency_ms: int
    fleet_s: float
    peer_s: float
    ideal_s: float
    cmds: float
    """Redis commands per branch, fleet."""
    peer_cmds: float
    cpu_ms: float
    """Worker CPU per branch, fleet."""
    peer_cpu_ms: float
    rss_bytes: float
    """Peak extra worker RSS during a fleet run."""
    bare_s: float = 0.0
    """HTTP rows: a chord of the branches' calls only, sent by the client (no root calls)."""
    same_s: float = 0.0
    """A plain root task making the fleet run's calls, its chord sent from the worker (HTTP
    rows: the peer itself; scripted rows: `bench.sleep_root`)."""
    same_cpu_ms: float = 0.0
    """Worker CPU per branch of that same-calls peer."""
    redis_us: float = 0.0
    """Redis CPU per branch (µs), fleet."""
    redis_kib: float = 0.0
    """Redis memory a fleet run leaves per branch (KiB), kept for the traces' TTL."""

    @classmethod
    def of(
        cls,
        kind: str,
        n: int,
        latency_ms: int,
        fleet: Sequence[Sample],
        peer: Sequence[Sample],
        ideal_s: float,
        bare: Sequence[Sample] = (),
        same: Sequence[Sample] = (),
    ) -> Row:
        med = statistics.median
        same = same or (peer if kind == "http" else ())
        return cls(
            kind=kind,
            n=n,
            latency_ms=latency_ms,
            fleet_s=med(s.seconds for s in fleet),
            peer_s=med(s.seconds for s in peer),
            ideal_s=ideal_s,
            cmds=med(s.commands / n for s in fleet),
            peer_cmds=med(s.commands / n for s in peer),
            cpu_ms=med(1000 * s.cpu_s / n for s in fleet),
            peer_cpu_ms=med(1000 * s.cpu_s / n for s in peer),
            rss_bytes=med(s.rss_bytes for s in fleet),
            bare_s=med(s.seconds for s in bare) if bare else 0.0,
            same_s=med(s.seconds for s in same) if same else 0.0,
            same_cpu_ms=med(1000 * s.cpu_s / n for s in same) if same else 0.0,
            redis_us=med(1e6 * s.redis_cpu_s / n for s in fleet),
            redis_kib=med(s.redis_bytes / n / 1024 for s in fleet),
        )

    def ratio(self, versus: str = "peer") -> float:
        base = {
            "peer": self.peer_s,
            "ideal": self.ideal_s,
            "bare": self.bare_s,
            "same": self.same_s,
        }[versus]
        return self.fleet_s / base if base > 0 else float("inf")


HEADER = (
    f"{'kind':>8} {'N':>5} {'L ms':>5} {'fleet s':>8} {'peer s':>7} {'ideal s':>8} "
    f"{'f/peer':>6} {'f/ideal':>7} {'cmds/br':>7} {'peer cmds':>9} {'cpu ms/br':>9} "
    f"{'peer cpu':>8} {'rss MiB':>7} {'f/bare':>6} {'redis us/br':>11} {'KiB/br':>6} "
    f"{'f/same':>6} {'same cpu':>8}  load"
)


def format_row(row: Row) -> str:
    ideal = f"{row.ratio('ideal'):>7.2f}" if row.latency_ms else f"{'-':>7}"
    bare = f"{row.ratio('bare'):>6.2f}" if row.bare_s else f"{'-':>6}"
    same = f"{row.ratio('same'):>6.2f} {row.same_cpu_ms:>8.2f}" if row.same_s else f"{'-':>15}"
    return (
        f"{row.kind:>8} {row.n:>5} {row.latency_ms:>5} {row.fleet_s:>8.3f} {row.peer_s:>7.3f} "
        f"{row.ideal_s:>8.3f} {row.ratio():>6.2f} {ideal} {row.cmds:>7.1f} "
        f"{row.peer_cmds:>9.1f} {row.cpu_ms:>9.2f} {row.peer_cpu_ms:>8.2f} "
        f"{row.rss_bytes / MIB:>7.1f} {bare} {row.redis_us:>11.0f} {row.redis_kib:>6.1f} "
        f"{same}  {load()}"
    )


def print_rows(makers: Sequence[Callable[[], Row]]) -> list[Row]:
    """Measure and print each row as it is ready (peer: chord of sleeps or of httpx calls)."""
    print(HEADER, flush=True)
    rows = []
    for make in makers:
        rows.append(make())
        print(format_row(rows[-1]), flush=True)
    return rows


def _find(rows: Sequence[Row], kind: str, n: int | None, latency_ms: int) -> Row | None:
    found = [r for r in rows if r.kind == kind and r.latency_ms == latency_ms]
    if n is None:  # the largest N measured
        return max(found, key=lambda r: r.n, default=None)
    return next((r for r in found if r.n == n), None)


def target_lines(
    rows: Sequence[Row], one_completion: tuple[float, float, float], slots: int
) -> list[tuple[str, str, str, str]]:
    """(case, measured, target, verdict) for every row of issue 14's table."""
    out: list[tuple[str, str, str, str]] = []

    def check(case: str, row: Row | None, value: Callable[[Row], float], limit: float, fmt: str):
        if row is None:
            out.append((case.replace("N={n}", "N=?"), "not run", f"<= {limit:g}", "-"))
            return
        measured = value(row)
        verdict = "PASS" if measured <= limit else "MISS"
        shown = fmt.format(measured)
        if value is Row.ratio and row.kind == "scripted" and row.same_s:
            shown += f" (same calls {row.ratio('same'):.2f}x)"
        out.append((case.format(n=row.n), shown, f"<= {limit:g}", verdict))

    big0 = _find(rows, "scripted", None, 0)
    check("Redis commands per branch (N={n}, 0 ms)", big0, lambda r: r.cmds, 50, "{:.1f}")
    check("worker CPU per branch, ms (N={n}, 0 ms)", big0, lambda r: r.cpu_ms, 2.5, "{:.2f}")
    check(
        "N=1000, 0 ms: fleet / plain chord",
        _find(rows, "scripted", 1000, 0),
        Row.ratio,
        2,
        "{:.2f}x",
    )
    check(
        "N=1000, 200 ms: fleet / plain chord",
        _find(rows, "scripted", 1000, 200),
        Row.ratio,
        1.5,
        "{:.2f}x",
    )
    check(
        "N=100, 200 ms: fleet / ideal (asyncio)",
        _find(rows, "scripted", 100, 200),
        lambda r: r.ratio("ideal"),
        1.3,
        "{:.2f}x",
    )
    for n in (100, 500):
        row = next((r for r in rows if r.kind == "http" and r.n == n), None)
        check(f"HTTP N={n}, 200 ms: fleet / chord of httpx calls", row, Row.ratio, 1.5, "{:.2f}x")
    fleet_s, inline_s, gap = one_completion
    out.append(
        (
            "one-completion `fleet run` minus `--inline`, s (median of pairs)",
            f"{gap:.2f} ({fleet_s:.2f} vs {inline_s:.2f})",
            "<= 0.15",
            "PASS" if gap <= 0.15 else "MISS",
        )
    )
    http = max((r for r in rows if r.kind == "http"), key=lambda r: r.n, default=None)
    if http is None:
        out.append(("worker RSS per 100 concurrent branches", "not run", "measured", "-"))
    else:
        concurrent = min(http.n, slots)
        per_100 = http.rss_bytes / concurrent * 100 / MIB
        case = f"worker RSS per 100 concurrent branches (HTTP N={http.n}, {concurrent} at once)"
        out.append((case, f"{per_100:.1f} MiB", "measured", "measured"))
    return out


def print_targets(
    rows: Sequence[Row], one_completion: tuple[float, float, float], slots: int
) -> None:
    """The issue's table: case, measured, target, verdict."""
    lines = target_lines(rows, one_completion, slots)
    width = max(len(case) for case, *_ in lines)
    print(f"\n{'target (issue 14)':<{width}}  {'measured':>30}  {'target':>8}  verdict")
    for case, measured, target, verdict in lines:
        print(f"{case:<{width}}  {measured:>30}  {target:>8}  {verdict}")


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "?",
    )
    return f"{os.cpu_count()} cpus ({cpu}), Python {platform.python_version()}, {platform.system()}"
