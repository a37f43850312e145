"""Operator tooling: the `fleet` command line, `fleet up`, metrics, doctor, the watch view.

Depends on `fleet` and on `workers` (the Celery binding); neither of them imports it.
"""
