"""The randomised lifecycle (`bench/chaos.py`) in small: every kind of fault, every tree ends.

`make chaos` injects 500 faults and docs/reliability.md records its table; here a seeded
run injects each kind at least once, so CI sees a tree left stuck within minutes.
"""

from __future__ import annotations

import pytest

from bench import chaos

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_every_tree_ends_whatever_lands_and_when() -> None:
    options = chaos.Options(faults=8, trees=3, per_round=4, seed=11, weights=(1, 1, 1, 1))
    table = chaos.run(options, say=print)
    assert all(table.injected[kind] >= 1 for kind in chaos.KINDS), table.injected
    assert table.stuck == [], table.markdown()
    assert table.duplicated == 0, table.markdown()
    assert sum(table.ended.values()) + table.gone == table.trees
