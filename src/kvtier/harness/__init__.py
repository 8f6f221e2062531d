"""vLLM driven as an instrument: its OpenAI server, its benchmark client, an offline probe.

The benchmarks, the main job and the tests use these; the connector does not.
"""
