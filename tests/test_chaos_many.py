"""`make chaos`'s seeds side by side (`bench/chaos_many.py`): their tables read and summed."""

from __future__ import annotations

from bench.chaos_many import markdown, summed, table_rows

SEED_A = """redis store, redis broker
  round 0: stop at 1.20 s
{head}
|------|---|---|---|---|---|---|---|---|---|---|---|
| redis | 38 | 169 | 141 | 0 | 0 | 0 | 2 | 0 | 10 | 0 | 0 | 64.6 s |
| cluster | 35 | 158 | 127 | 2 | 0 | 19 | 1 | 0 | 10 | 0 | 0 | 90.1 s |
failing: round 24 (redis, redis): python bench/chaos.py --seed 40 --round 24
""".format(
    head="| backend | rounds | trees | faults | stuck | lost | gone | doubled | costs off"
    " | tracebacks | secrets | CLI errors not one line | slowest |"
)
SEED_B = """| redis | 2 | 9 | 7 | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 70.0 s |
| cluster | 1 | 4 | 3 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 12.5 s |
"""


def test_the_seeds_rows_are_added_and_the_slowest_kept() -> None:
    total = summed([table_rows(SEED_A), table_rows(SEED_B)])
    assert total["redis"] == [40, 178, 148, 1, 0, 0, 2, 0, 10, 0, 0, 70.0]
    assert total["cluster"] == [36, 162, 130, 2, 0, 19, 1, 0, 10, 0, 0, 90.1]
    printed = markdown(total).splitlines()
    assert printed[2] == "| redis | 40 | 178 | 148 | 1 | 0 | 0 | 2 | 0 | 10 | 0 | 0 | 70.0 s |"


def test_lines_that_are_not_a_backend_row_are_passed_over() -> None:
    assert set(table_rows(SEED_A)) == {"redis", "cluster"}, "not the head, rule or failing line"
    assert table_rows("| a | b |\nno table here") == {}
