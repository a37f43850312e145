"""Open paths inside the workspace without check-then-open races.

`resolve_in_workspace` checks a path, but the file system can change between that check
and the `open`: a folder swapped for a symlink to `/` in between (TOCTOU) makes the open
land outside. So the file tools open **component by component** from a descriptor of the
workspace root, each step with `O_NOFOLLOW` relative to the previous folder's descriptor
(`dir_fd`). A symlink met on the way is read (`readlink`) and its target walked the same
way, so links that stay inside keep working and links that leave are refused, whatever
happens to the tree meanwhile: every step is a fresh `openat` of one name.

A regular file with more than one hard link is refused too: a hard link made inside the
workspace to a file outside (no symlink to catch) would otherwise be read and written
through.

The fleet's own state (`Settings.private_dirs`: Redis's append-only file, worker logs,
`up.json`) is refused whatever the workspace roots say, even when a root holds it: every
folder walked is compared with it by real path (so a folder not made yet cannot be made
there) and by inode (so a bind mount or a second path to it is refused too).
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.errors import ToolError
from fleet.tools.workspace import lexical_parts

MAX_SYMLINKS = 40
"""As the kernel's own limit: more links than this in one path is a loop."""
PRIVATE_REFUSAL = "that path is the fleet's own state, which no tool opens"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Opened:
    """An open descriptor (the caller closes it) and the workspace-relative path."""

    fd: int
    rel: str
    created: bool = False


Inode = tuple[int, int]
"""(st_dev, st_ino): a folder whatever path reaches it."""


def private_inodes(folders: Iterable[Path]) -> frozenset[Inode]:
    """The inodes of those of `folders` that exist."""
    found = set()
    for folder in folders:
        try:
            info = os.stat(folder)
        except OSError:
            continue  # not made yet: the real-path check covers it
        found.add((info.st_dev, info.st_ino))
    return frozenset(found)


@dataclass(frozen=True)
class _Private:
    """Folders no tool opens: the fleet's state, by real path and by inode."""

    paths: tuple[Path, ...] = ()
    inodes: frozenset[Inode] = frozenset()

    @classmethod
    def of(cls, folders: tuple[Path, ...]) -> _Private:
        real = tuple(folder.expanduser().resolve() for folder in folders)
        return cls(real, private_inodes(real))

    def check_path(self, real: Path) -> None:
        """`ToolError` if `real` is private or inside a private folder, made yet or not."""
        if any(real.is_relative_to(path) for path in self.paths):
            raise ToolError(PRIVATE_REFUSAL)

    def check_fd(self, fd: int) -> int:
        """`fd`, or closed and a `ToolError` if it is a private folder."""
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) in self.inodes:
            os.close(fd)
            raise ToolError(PRIVATE_REFUSAL)
        return fd


@dataclass
class _Walk:
    """The folders walked so far: descriptors from the root down, and their names."""

    fds: list[int]
    names: list[str]
    private: _Private = field(default_factory=_Private)
    links: int = 0
    created: bool = False
    """The final file did not exist and was made by this open."""

    def close_below_root(self) -> None:
        for fd in self.fds[1:]:
            os.close(fd)
        del self.fds[1:], self.names[:]


def open_dir(
    root: Path, path: str, *, create: bool = False, private: tuple[Path, ...] = ()
) -> Opened:
    """A descriptor of folder `path` inside `root`, and its workspace-relative name.

    Args:
        root: The workspace root.
        path: As the model wrote it.
        create: Make missing folders (as `mkdir -p`).
        private: Folders refused wherever they are (the fleet's state).

    Raises:
        ToolError: it leaves the workspace, is private, does not exist, or is not a folder.
    """
    return _open(root, path, None, create, private)


def open_file(
    root: Path,
    path: str,
    flags: int,
    *,
    create_dirs: bool = False,
    private: tuple[Path, ...] = (),
) -> Opened:
    """A descriptor of regular file `path` inside `root`, opened with `flags`.

    `O_CREAT` may be in `flags`; `O_TRUNC` must not (the hard-link check comes first:
    truncate after it). The file must be a regular file with a single link.

    Raises:
        ToolError: it leaves the workspace, is missing (without `O_CREAT`), is not a
            regular file, or has other hard links.
    """
    if flags & os.O_TRUNC:
        raise ValueError("open_file: truncate after the link check, not with O_TRUNC")
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    opened = _open(root, path, flags, create_dirs, private)
    try:
        info = os.fstat(opened.fd)
        if stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{path!r} is not a file (use list_dir for folders)")
        if not stat.S_ISREG(info.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        if info.st_nlink > 1:
            raise ToolError(
                f"{path!r} has {info.st_nlink} hard links; a file linked from elsewhere is"
                " neither read nor written"
            )
        os.set_blocking(opened.fd, True)
    except BaseException:
        os.close(opened.fd)
        raise
    return opened


def open_path(root: Path, path: str, private: tuple[Path, ...] = ()) -> Opened:
    """A read-only descriptor of `path` inside `root`, file or folder, for walking from it.

    Raises:
        ToolError: it leaves the workspace, is private, or does not exist.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    parts = lexical_parts(root, root.resolve(strict=True), path)
    if parts:
        return _open(root, path, flags, False, private)
    return open_dir(root, path, private=private)


def _open(
    root: Path, path: str, file_flags: int | None, create: bool, private: tuple[Path, ...]
) -> Opened:
    base = root.resolve(strict=True)
    parts = lexical_parts(root, base, path)
    walk = _Walk(fds=[os.open(base, _DIR_FLAGS)], names=[], private=_Private.of(private))
    try:
        walk.private.check_path(base)
        os.close(walk.private.check_fd(os.dup(walk.fds[0])))
        pending = deque(parts)
        while pending:
            name = pending.popleft()
            final = not pending and file_flags is not None
            fd = _step(walk, base, name, pending, file_flags if final else None, create)
            if fd is None:
                continue  # a symlink or '..' changed what is pending
            if final:
                return Opened(fd, "/".join([*walk.names, name]), walk.created)
            walk.fds.append(fd)
            walk.names.append(name)
        if file_flags is not None:
            raise ToolError(f"{path!r} is a folder")
        return Opened(os.dup(walk.fds[-1]), "/".join(walk.names) or ".")
    finally:
        for fd in walk.fds:
            os.close(fd)


def _step(
    walk: _Walk,
    base: Path,
    name: str,
    pending: deque[str],
    file_flags: int | None,
    create: bool,
) -> int | None:
    """Open one name below the current folder; None when it was a link or '..' instead."""
    if name == "..":
        if not walk.names:
            raise ToolError("path leaves the workspace")
        os.close(walk.fds.pop())
        walk.names.pop()
        return None
    parent = walk.fds[-1]
    # Every name walked is real (links are re-walked): checked before anything is made.
    walk.private.check_path(base.joinpath(*walk.names, name))
    try:
        if file_flags is None:
            return walk.private.check_fd(_open_folder(name, parent, create))
        return walk.private.check_fd(_open_final(walk, name, file_flags, parent))
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise _tool_error(name, exc) from None
    _follow(walk, base, name, pending)
    return None


def _open_final(walk: _Walk, name: str, flags: int, parent: int) -> int:
    """Open the last name; with O_CREAT, say whether this open made the file."""
    if flags & os.O_CREAT:
        try:
            fd = os.open(name, flags | os.O_EXCL, 0o666, dir_fd=parent)
        except FileExistsError:  # also a symlink, dangling or not: opened below, refused
            flags &= ~os.O_CREAT
        else:
            walk.created = True
            return fd
    return os.open(name, flags, dir_fd=parent)


def _open_folder(name: str, parent: int, create: bool) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, 0o777, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile: open whatever is there, with O_NOFOLLOW again
    return os.open(name, _DIR_FLAGS, dir_fd=parent)


def _follow(walk: _Walk, base: Path, name: str, pending: deque[str]) -> None:
    """`name` failed to open as asked: walk its link target instead, if it is a link."""
    try:
        target = os.readlink(name, dir_fd=walk.fds[-1])
    except OSError as exc:  # EINVAL: not a link, so a file where a folder was needed
        raise ToolError(f"{name!r} is not a folder") from exc
    walk.links += 1
    if walk.links > MAX_SYMLINKS:
        raise ToolError("too many symbolic links (a loop?)")
    if os.path.isabs(target):
        inside = Path(os.path.normpath(target))
        if not inside.is_relative_to(base):
            raise ToolError(f"{name!r} leaves the workspace through a symlink")
        walk.close_below_root()
        pending.extendleft(reversed(inside.relative_to(base).parts))
    else:
        pending.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))


def _tool_error(name: str, exc: OSError) -> ToolError:
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"no such file or folder: {name!r}")
    return ToolError(f"cannot open {name!r}: {exc.strerror}")
