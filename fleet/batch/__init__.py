"""Batches of root tasks: the batch file, the bounded run window and the results journal."""

DEFAULT_MAX_IN_FLIGHT = 8
"""Unfinished tasks a batch keeps at once; here, so `fleet --help` can show it cheaply."""
