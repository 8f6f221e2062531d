"""The disk tiers' I/O: thread-pool and io_uring backends, aligned buffers, ring batches."""
