"""Reusable conformance suites: one generic test class per contract (see tests/ for their use)."""
