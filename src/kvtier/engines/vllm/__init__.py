"""kvtier inside vLLM (its KV-connector interface). vLLM is imported only when this is used.

:mod:`kvtier.engines.vllm.compat` pins the vLLM releases kvtier's connector is written against
and checks that the installed one still offers the connector interface it relies on.
"""
