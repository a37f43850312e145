"""The limits on Redis: the Lua every limit runs (`scripts`), and what runs it.

The provider limiter (`limiter`), budgets (`budgets`), tree schedules (`trees`), search
counts (`searches`).
"""
