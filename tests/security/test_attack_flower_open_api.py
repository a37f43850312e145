"""Found in the issue-39 review: Flower without a login answered every web page.

`fleet up --flower` and `fleet flower` on loopback run Flower without a login and with its
open API (`FLOWER_UNAUTHENTICATED_API`). Flower 2 then sends `Access-Control-Allow-Origin:
*` and skips its own cross-site checks, so any page the operator opened could read the
task list and launch tasks, revoke them or shut workers down; a DNS-rebinding page reached
it under its own name (`Host: evil.example:P`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fleetkit import wait_until
from tests.test_flower_api import SEEN_TIMEOUT_S, answers, start_flower, stop

pytestmark = pytest.mark.integration

SHUTDOWN = "/api/worker/shutdown/nobody@nowhere"


@pytest.fixture
def open_flower(redis_url: str, tmp_path: Path) -> Iterator[tuple[httpx.Client, int]]:
    """`fleet flower` on loopback with no login: the open API."""
    process, port = start_flower(redis_url, tmp_path)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as http:
            wait_until(lambda: answers(http, "/healthcheck"), SEEN_TIMEOUT_S, "Flower to listen")
            yield http, port
    finally:
        stop(process)


def test_another_sites_page_gets_no_answer_from_the_open_api(
    open_flower: tuple[httpx.Client, int],
) -> None:
    """Route: a page on another site fetched `/api/workers` (CORS `*` let it read the
    answer) and POSTed a worker shutdown. Control: no CORS headers, and a request that says
    it comes from another site or origin is refused."""
    http, port = open_flower
    cross = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}
    read = http.get("/api/workers", headers={**cross, "Sec-Fetch-Mode": "cors"})
    act = http.post(SHUTDOWN, headers={"Origin": "http://evil.example"})
    plain = http.get("/api/workers")

    assert read.status_code == 403 and act.status_code == 403, (read.text, act.text)
    assert "access-control-allow-origin" not in {k.lower() for k in plain.headers}
    assert plain.status_code == 200
    navigation = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert http.get("/", headers=navigation).status_code == 200, "a link followed still opens"


def test_a_rebinding_host_is_refused(open_flower: tuple[httpx.Client, int]) -> None:
    """Route: a DNS-rebinding page reached Flower as `evil.example:P`, same-origin to the
    browser. Control: without a login only loopback host names are answered."""
    http, port = open_flower
    rebound = http.get("/api/workers", headers={"Host": f"evil.example:{port}"})
    shutdown = http.post(SHUTDOWN, headers={"Host": f"evil.example:{port}"})
    assert rebound.status_code == 403 and shutdown.status_code == 403
    assert http.get("/api/workers", headers={"Host": f"localhost:{port}"}).status_code == 200
