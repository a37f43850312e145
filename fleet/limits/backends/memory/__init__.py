"""The limits in one process: the limiter (`limiter`), budgets and tree schedules (`trees`)."""
