"""The order a parallel run hands out test files: the longest first, by recorded seconds.

xdist (`--dist loadfile`, with `--no-loadscope-reorder`) gives each free process the next
file in collection order. A file of a minute handed out last runs alone at the end while
the other processes sit idle; handed out first, the short files fill in around it.
`durations.json` holds each file's seconds from a recorded run; a file it does not know
goes first (it may be long). `make durations` records them again:

    python -m tests.durations JUNIT_XML   # writes tests/durations.json
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

import pytest

RECORD = Path(__file__).with_name("durations.json")


def longest_files_first(items: list[pytest.Item], root: Path) -> None:
    """Sort `items` in place: files by recorded seconds, longest (or unknown) first."""
    seconds = recorded()

    def key(item: pytest.Item) -> float:
        return -seconds.get(item.path.relative_to(root).as_posix(), float("inf"))

    items.sort(key=key)  # stable: a file's own tests keep their order


def recorded() -> dict[str, float]:
    """File -> seconds from `durations.json`; empty when there is none."""
    try:
        data = json.loads(RECORD.read_text())
    except FileNotFoundError:
        return {}
    return {str(path): float(seconds) for path, seconds in data.items()}


def seconds_by_file(junit_xml: Path) -> dict[str, float]:
    """Each file's seconds (setup, call and teardown of its tests) in a JUnit XML report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        while module and not module[-1].startswith("test_"):
            module.pop()  # a test class's name, not the module's
        totals["/".join(module) + ".py"] += float(case.get("time", 0))
    return {path: round(total, 1) for path, total in sorted(totals.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.durations JUNIT_XML", file=sys.stderr)
        return 2
    RECORD.write_text(json.dumps(seconds_by_file(Path(argv[0])), indent=0) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
