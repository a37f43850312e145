"""The body of the `grep` tool, run in a child process that is killed at the time limit.

Python's `re` backtracks: `(a+)+$` against a long line runs for hours and cannot be
interrupted inside a thread. So `fleet.tools.search.grep` runs this file as
`python -I -S grep_child.py` (isolated: no PYTHONPATH, no workspace on `sys.path`, and
no `site` import, so no `.pth` file runs, wherever an agent wrote one), hands it the
request on stdin and an open descriptor of where to search, and kills it when the tool's
time runs out. Standard library only: without `site` there are
no site-packages to import from.

It walks with `os.fwalk` from that descriptor (no symlink followed, every folder opened
relative to its parent) and opens each file with `O_NOFOLLOW`, skipping files with other
hard links, so it reads what the parent checked and nothing else. It never descends into
the fleet's own state (`private_inodes`: Redis's append-only file, worker logs), even when
the workspace holds it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _read(name: str, dir_fd: int, max_bytes: int) -> bytes | None:
    """The file's bytes, or None for links, non-regular, linked, huge or binary files."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return _read_fd(fd, max_bytes)
    finally:
        os.close(fd)


def _read_fd(fd: int, max_bytes: int) -> bytes | None:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1 or info.st_size > max_bytes:
        return None
    os.set_blocking(fd, True)
    data = os.pread(fd, max_bytes + 1, 0)
    return None if len(data) > max_bytes or b"\x00" in data[:8192] else data


def _inode(name: str, dir_fd: int) -> tuple[int, int] | None:
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _files(request: dict[str, Any]) -> Iterator[tuple[str, bytes]]:
    """(workspace-relative path, content) of every searchable file, in a stable order."""
    fd, prefix, include = request["fd"], request["prefix"], request["include"]
    if request["is_file"]:
        data = _read_fd(fd, request["max_file_bytes"])
        if data is not None:
            yield prefix, data
        return
    skipped = set(request["skipped_dirs"])
    private = {tuple(inode) for inode in request["private_inodes"]}
    for folder, dirs, names, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        dirs[:] = sorted(d for d in dirs if d not in skipped and _inode(d, dir_fd) not in private)
        for name in sorted(names):
            rel = str(PurePosixPath(prefix, folder, name)).removeprefix("./")
            if include and not PurePosixPath(rel).match(include):
                continue
            data = _read(name, dir_fd, request["max_file_bytes"])
            if data is not None:
                yield rel, data


def main() -> None:
    """Read the request, print one JSON line per match, then a summary line."""
    request = json.loads(sys.stdin.read())
    regex = re.compile(request["pattern"], re.IGNORECASE if request["ignore_case"] else 0)
    limit, width = request["max_matches"], request["max_line_chars"]
    found = files_with_matches = 0
    for rel, data in _files(request):
        hit = False
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if regex.search(line):
                print(json.dumps([rel, number, line[:width]]), flush=False)
                found += 1
                hit = True
                if found >= limit:
                    break
        files_with_matches += hit
        if found >= limit:
            break
    print(json.dumps({"files_with_matches": files_with_matches}))


if __name__ == "__main__":
    main()
