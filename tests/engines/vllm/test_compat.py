"""The pinned vLLM's KV-connector API is the one kvtier's connector is written against."""

from __future__ import annotations

import os

import pytest

from kvtier.engines.vllm.compat import (
    CONNECTOR_API,
    RELEASE_API,
    TRANSFER_CONFIG_FIELDS,
    api_mismatches,
    check_vllm,
    expected_api,
    version_supported,
    vllm_version,
)

ALLOW_SKIP = "KVTIER_ALLOW_SKIP_VLLM"  # set to 1 to skip (not fail) where vLLM is absent


@pytest.fixture(scope="module")
def installed_vllm() -> str:
    try:
        return vllm_version()
    except Exception as exc:  # MissingExtraError: make test installs it, so this is a failure
        if os.environ.get(ALLOW_SKIP) == "1":
            pytest.skip(str(exc))
        pytest.fail(f"vLLM is not installed here ({exc}); make test installs it")


def test_the_installed_vllm_is_the_pinned_one_with_the_api_the_connector_uses(installed_vllm):
    assert version_supported(installed_vllm), installed_vllm
    check_vllm()


def test_versions_outside_the_range_are_refused():
    assert version_supported("0.32.0") and version_supported("0.32.7")
    assert version_supported("0.33.0") and version_supported("0.33.2")
    for other in ("0.31.9", "0.34.0", "1.0.0", "not-a-version"):
        assert not version_supported(other)


def test_vllm_033s_interface_is_the_one_the_connector_expects_of_it():
    """0.33's ``KVConnectorBase_V1`` (read from its PyPI wheel into data/) has every method the
    connector uses with the same parameters, and the three 0.33 adds; 0.32's check stays as
    it was, and the connector implements the methods 0.33 adds."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "data" / "vllm-0.33-connector-api.json").read_text())
    base = {name: tuple(params) for name, params in doc["connector_base"].items()}
    expected = expected_api("0.33.0")
    assert set(RELEASE_API["0.33"]) <= set(expected)
    assert {n: base.get(n) for n in expected} == expected
    assert expected_api("0.32.0") == dict(CONNECTOR_API)
    assert set(TRANSFER_CONFIG_FIELDS) <= set(doc["transfer_config_fields"])
    from kvtier.engines.vllm.connector import KVTierConnector

    for name in RELEASE_API["0.33"]:
        assert name in vars(KVTierConnector), name


def test_a_moved_method_is_reported_by_name():
    class Base:
        def __init__(self, vllm_config, role, kv_cache_config): ...

        def get_num_new_matched_tokens(self, request, num_computed_tokens, extra): ...

    found = {m.method: m for m in api_mismatches(Base)}
    assert found["get_num_new_matched_tokens"].found == ("request", "num_computed_tokens", "extra")
    assert found["wait_for_save"].found is None and "missing" in str(found["wait_for_save"])
    assert "__init__" not in found
    assert len(found) == len(CONNECTOR_API) - 1
