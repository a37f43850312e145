"""The limits in one process: the limiter, budgets and schedules, search counts.

`limiter`, `trees` (budgets and tree schedules), `searches`.
"""
