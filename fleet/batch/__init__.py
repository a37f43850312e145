"""Batches of root tasks: the batch file, the bounded run window and the results journal."""
