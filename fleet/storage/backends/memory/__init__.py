"""The store in one process: `MemoryStore` (`store`, `workers`) and the batch-call queue."""
