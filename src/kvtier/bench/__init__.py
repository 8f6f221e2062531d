"""Measured benchmarks: storage tiers (with fio or a plain copy as the reference in the same run).

Modules: ``stats`` (latency/throughput summaries), ``driver`` (threaded timed passes),
``fio`` (fio job builder, runner and JSON parser), ``reference`` (plain-copy reference),
``env`` (O_DIRECT / filesystem / page-cache probes), ``storage`` (the storage benchmark),
``report`` (table, JSON, plot).
"""

from kvtier.bench.stats import LatencyStats, PassResult

__all__ = ["LatencyStats", "PassResult"]
