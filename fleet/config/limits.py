"""The rules every budget and limit obeys, wherever it is written.

Budgets (`Budget(...)`, `fleet run --budget-*`, a batch entry's `budget:`, a preset's
`budget:`), rate limits (`limits:` in fleet.yaml), prices and fan-out caps all take their
field types from here, so a value refused at one entry is refused at every other:

- negative: never (a negative price would pay a tree back; a negative budget is nonsense);
- zero: only where it means "none" (no sub-agents, no depth); a token budget, a rate, a
  concurrency or a wall time of zero would stop everything before it starts;
- NaN and infinity: never (NaN compares false with everything, so a check against it passes;
  "no limit" is written by leaving the field out);
- booleans and strings are not numbers (`true` is not 1).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from fleet.errors import InvalidLimit

Count = Annotated[int, Field(strict=True, ge=0)]
"""Whole things where 0 means none: sub-agents, depth."""
PositiveCount = Annotated[int, Field(strict=True, gt=0)]
"""Whole things where 0 would stop everything: tokens, requests, calls in flight."""
Amount = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
"""A finite quantity above zero: dollars, seconds (an integer is taken as a float)."""
Price = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
"""A finite price; 0 is a free model."""
M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: Any, where: str = "", prefix: str = "") -> M:
    """`data` as `model`, or one line naming where, the field, the rule and the value.

    Args:
        model: The pydantic model whose fields use the types above.
        data: What was written.
        where: The file and line, or the flag, that wrote it ("" for the Python API).
        prefix: Put before the field name (`budget.`).

    Raises:
        InvalidLimit: e.g. `batch.yaml:3: budget.usd: must be greater than 0 (got -5)`.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problem = prefix + describe(exc)
        raise InvalidLimit(f"{where}: {problem}" if where else problem) from None


def describe(exc: ValidationError) -> str:
    """The first problem of a validation error, in one line with the offending value."""
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"{field}: unknown setting"
    message = str(error["msg"]).removeprefix("Input should be ").removeprefix("Value error, ")
    return f"{field}: must be {message} (got {error.get('input')!r})"
