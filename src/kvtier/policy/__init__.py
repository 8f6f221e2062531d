"""Policies built on the cost model: eviction, admission, load-or-recompute, prefetch order."""
