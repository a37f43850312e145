"""Observation that does not grow the loop: typed hooks, OpenTelemetry spans, following.

A client follows a tree's events to its end in following.py.
"""
