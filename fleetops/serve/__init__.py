"""`fleet serve`: a read-mostly HTTP view of the trace store, with a live page."""
