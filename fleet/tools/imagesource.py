"""Images a task is given: `fleet run --image PATH|URL`, `Fleet.submit(images=...)`, batch.

A URL (http or https) is fetched here, by the fleet, through the SSRF guard
(`fleet.tools.netguard`, FLEET_WEB_ALLOW for internal hosts) with no redirect followed and
the body cut past `MAX_IMAGE_BYTES`; a path is read from the caller's disk, or, for a
batch entry (untrusted), only inside its workspace (`fleet.tools.safe_open`). Either way
the bytes are checked by content (`fleet.tools.imagecheck`) before anything stores them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from fleet.errors import ConfigError, ToolError
from fleet.tools.imagecheck import MAX_IMAGE_BYTES, Image, checked
from fleet.tools.safe_open import open_file
from fleet.tools.websearch import http

MAX_TASK_IMAGES = 20
"""Images one task may be given."""
FETCH_TIMEOUT_S = 20.0


def load_images(
    sources: Sequence[str | Path],
    *,
    workspace: Path | None = None,
    web_allow: tuple[str, ...] = (),
    private: tuple[Path, ...] = (),
) -> tuple[Image, ...]:
    """Each source's image, checked; `ConfigError` names the first source that is refused.

    Args:
        sources: file paths or http(s) URLs.
        workspace: when set, paths are confined to it (a batch file's entries); else they
            are the caller's own files.
        web_allow: FLEET_WEB_ALLOW: the internal hosts a URL may name.
        private: the fleet's state folders, never opened inside `workspace`.
    """
    if len(sources) > MAX_TASK_IMAGES:
        raise ConfigError(f"{len(sources)} images given; at most {MAX_TASK_IMAGES} per task")
    try:
        return tuple(_load(str(s), workspace, web_allow, private) for s in sources)
    except ToolError as exc:
        raise ConfigError(f"image refused: {exc}") from None


def _load(
    source: str, workspace: Path | None, web_allow: tuple[str, ...], private: tuple[Path, ...]
) -> Image:
    if source.lower().startswith(("http://", "https://")):
        return _fetched(source, web_allow)
    if "://" in source or source.startswith("data:"):
        raise ToolError(f"{source[:60]!r}: give a file path or an http(s) URL")
    if workspace is not None:
        opened = open_file(workspace, source, os.O_RDONLY, private=private)
        with os.fdopen(opened.fd, "rb") as file:
            return _capped_check(file.read(MAX_IMAGE_BYTES + 1), repr(source))
    path = Path(source).expanduser()
    try:
        with path.open("rb") as file:
            return _capped_check(file.read(MAX_IMAGE_BYTES + 1), repr(source))
    except OSError as exc:
        raise ToolError(f"{source!r}: {exc.strerror or type(exc).__name__}") from None


def _fetched(url: str, web_allow: tuple[str, ...]) -> Image:
    answer = http.get(
        url,
        {"Accept": "image/png, image/jpeg, image/gif, image/webp"},
        web_allow,
        FETCH_TIMEOUT_S,
        what="image URL",
        tool="an image URL",
        max_bytes=MAX_IMAGE_BYTES,
    )
    host = urlsplit(url).hostname or "?"
    if answer.status >= 400:
        raise ToolError(f"image URL on {host!r} answered HTTP {answer.status}")
    if answer.cut:
        raise ToolError(f"image URL on {host!r}: larger than {MAX_IMAGE_BYTES} bytes: refused")
    return checked(answer.body, f"image URL on {host!r}")


def _capped_check(data: bytes, name: str) -> Image:
    if len(data) > MAX_IMAGE_BYTES:
        raise ToolError(f"{name}: larger than {MAX_IMAGE_BYTES} bytes: refused")
    return checked(data, name)
