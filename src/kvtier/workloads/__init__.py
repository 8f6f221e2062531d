"""Seeded workload generators: the sessions `kvtier run` drives (and, later, the simulator)."""
