"""The unit tier cannot reach a server: a test asking for one must be marked integration."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ("pytester",)

INNER_CONFTEST = """
import pytest
from tests.conftest import pytest_collection_modifyitems  # the hook under test

@pytest.fixture(scope="session")
def redis_url():
    raise AssertionError("a server was reached")
"""
INNER_INI = """
[pytest]
markers =
    integration: needs a server
"""


def run_inner(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, test: str
) -> pytest.RunResult:
    """Run `test` in a fresh pytest process under the suite's hook, as `make unit` does."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makeini(INNER_INI)
    pytester.makepyfile(test_inner=test)
    return pytester.runpytest_subprocess("-q", "-m", "not integration")


def test_a_server_test_without_the_mark_is_a_collection_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_inner(pytester, monkeypatch, "def test_talks_to_redis(redis_url):\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*need a server but are not marked integration*test_talks_to*"])


def test_a_marked_server_test_is_left_out_of_the_unit_tier(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    test = (
        "import pytest\n\n"
        "@pytest.mark.integration\n"
        "def test_talks_to_redis(redis_url):\n    pass\n\n"
        "def test_pure():\n    pass\n"
    )
    result = run_inner(pytester, monkeypatch, test)
    result.assert_outcomes(passed=1, deselected=1)
