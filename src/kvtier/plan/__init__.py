"""Capacity planner: the memory-wall sequence for a model × hardware × context × concurrency."""

from kvtier.cost.transfer import SpillTier
from kvtier.plan.inputs import parse_concurrency, parse_reserve, parse_shared
from kvtier.plan.planner import (
    DEFAULT_RESERVE_FRACTION,
    Capacity,
    Event,
    Plan,
    PlanRequest,
    Row,
    TierReport,
    default_prefix_lengths,
    plan,
    request_ttft,
)

__all__ = [
    "DEFAULT_RESERVE_FRACTION",
    "Capacity",
    "Event",
    "Plan",
    "PlanRequest",
    "Row",
    "SpillTier",
    "TierReport",
    "default_prefix_lengths",
    "parse_concurrency",
    "parse_reserve",
    "parse_shared",
    "plan",
    "request_ttft",
]
