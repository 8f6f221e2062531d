"""Moving whole KV blocks between an engine's paged KV (CPU or CUDA) and kvtier's host chunks.

Imports no vLLM: an engine describes its caches as tensor views, blocks first, and the
transfer engine reads each layer's page layout off their strides (`pages`), copies on the host
(`host`) or through a pinned staging ring and copy streams (`cuda`), and reports a load layer by
layer (`progress`). `engine` holds the contract and picks the implementation.
"""

from kvtier.engines.transfer.choose import open_transfer_engine
from kvtier.engines.transfer.engine import (
    DEFAULT_RING_BYTES,
    NULL_BLOCK,
    Placement,
    TransferEngine,
)
from kvtier.engines.transfer.pages import LayerPages, PagedKV
from kvtier.engines.transfer.progress import LoadProgress

__all__ = [
    "DEFAULT_RING_BYTES",
    "NULL_BLOCK",
    "LayerPages",
    "LoadProgress",
    "PagedKV",
    "Placement",
    "TransferEngine",
    "open_transfer_engine",
]
