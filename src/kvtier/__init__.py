"""kvtier: a tiered KV cache for long-context LLM serving, driven by one cost model."""

__version__ = "0.1.0"
