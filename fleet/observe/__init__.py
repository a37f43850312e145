"""Observation that does not grow the loop: typed hooks and the OpenTelemetry spans."""
