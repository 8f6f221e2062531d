"""Tiers on a local filesystem: the shared ``FileTier`` base, ``file://`` and ``slab://``."""
