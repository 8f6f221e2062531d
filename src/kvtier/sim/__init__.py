"""The serving simulator: vLLM-style replicas, a paged engine pool, kvtier's tiers and links.

It runs the real books (``tiers.ledger``), eviction and admission policies (``policy``) and
load-or-recompute decision over simulated time; execution times come from ``cost`` (a roofline
from specs) or from what a real run measured (:mod:`kvtier.sim.timing`).
"""
