"""Every link between the README and docs/ lands: the file exists and so does the anchor.

Anchors are GitHub's: a heading lower-cased, punctuation but `-` and `_` dropped, spaces
turned into `-`, and a repeated heading numbered (`-1`, `-2`). Links to other sites are
not fetched (tests never leave the machine).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The numbered lines outside fenced code blocks (a `[x](y)` in code is not a link)."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    text = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    for _, line in prose_lines(path):
        if match := HEADING.match(line):
            base = slug(match.group(2))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """`FILE:LINE: target` for every relative link whose file or anchor is missing."""
    broken = []
    for number, line in prose_lines(path):
        for match in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = match.group(1) or match.group(2)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not linked.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where} (no heading #{anchor} in {linked.name})")
    return broken


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_of_the_docs_lands(path: Path) -> None:
    assert not broken_links(path)


def test_every_doc_is_listed_in_the_docs_index() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    unlisted = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "README.md"]
    assert [name for name in unlisted if f"({name})" not in index] == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# Top\n\n## Set up\n\n## Set up\n")
    page = tmp_path / "probe.md"
    page.write_text(
        "# Probe\n\n## Two `words`, too\n\n[ok](#two-words-too) [gone](nowhere.md) "
        "[bad](README.md#no-such-heading) [dup](README.md#set-up-1)\n\n"
        "```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "probe.md:5: nowhere.md (no such file)",
        "probe.md:5: README.md#no-such-heading (no heading #no-such-heading in README.md)",
    ]
