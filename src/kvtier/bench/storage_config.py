"""What ``kvtier bench storage`` measures (its config), apart from the bench that runs it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvtier.codec import BlockMeta
from kvtier.codec.container import DTYPES
from kvtier.errors import ConfigError
from kvtier.specs import MiB, ModelSpec, get_model
from kvtier.specs.jsonout import attrs
from kvtier.specs.model import dtype_bytes
from kvtier.tiers import TierURL

#: The reference kinds a row may have: fio, a plain copy, a shared tier's stock client, or the
#: same tier with ``codec=raw``.
RAW_TWIN = "raw"
DEFAULT_DATA = 512 * MiB
#: What the blocks hold: random bytes, or real KV chunks of the embedded model (the codec corpus).
PAYLOAD_KINDS = ("random", "kv")
#: What each tier is compared with: ``auto`` (fio for disk tiers, a plain copy for memory, the
#: stock client for shared tiers) or ``raw`` (the same tier with ``codec=raw``: its twin, in the
#: same place under a namespace of its own, taking turns with it slice by slice).
REFERENCE_KINDS = ("auto", RAW_TWIN)
KV_PAYLOAD_MODEL = "smollm2-135m"


def url_codec(url: str) -> str:
    """The codec a tier URL stores blocks with (its ``codec=`` option or the tier's default)."""
    from kvtier.codec import get_codec
    from kvtier.tiers.registry import options_class
    from kvtier.tiers.url import parse_options

    parsed = TierURL.parse(url)
    options = options_class(parsed.scheme)
    codec = getattr(parse_options(options, parsed), "codec", "raw") if options else "raw"
    return get_codec(codec).name


@dataclass(frozen=True)
class StorageBenchConfig:
    """What ``kvtier bench storage`` measures.

    ``block_size`` defaults to the model's KV bytes per token × ``chunk_tokens``; ``data_size`` is
    the bytes written (and read back) per tier and depth; each depth is measured ``repeats``
    times (kvtier and reference alternating, disk passes slice by slice in up to ``slices``
    slices) and the median pass reported. ``batch`` is the blocks per request (None: 1 per
    thread for threaded drives; for native ones the chunks of a 32k-token prefix, see
    ``native_request_blocks``). ``drive`` is ``auto`` (native where the tier has its
    own parallelism), ``threads`` or ``native``.
    """

    tiers: tuple[str, ...]
    model: str = "smollm2-135m"
    chunk_tokens: int = 256
    block_size: int | None = None
    depths: tuple[int, ...] = (1, 4, 16)
    data_size: int = DEFAULT_DATA
    batch: int | None = None
    drive: str = "auto"
    min_read_seconds: float = 0.3
    repeats: int = 1
    slices: int = 8
    fio: bool = True
    lookup: bool = True
    lookup_chunks: int = 512
    lookup_repeats: int = 200
    payload: str = "random"
    reference: str = "auto"

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigError("give at least one tier, e.g. --tier 'memory://?size=2GiB'")
        if not self.depths or min(self.depths) < 1:
            raise ConfigError(f"depths must be positive integers, got {self.depths}")
        if self.chunk_tokens <= 0 or (self.batch is not None and self.batch <= 0):
            raise ConfigError("chunk tokens and batch must be positive")
        if self.block_size is not None and self.block_size <= 0:
            raise ConfigError("block size must be positive")
        if self.data_size <= 0:
            raise ConfigError("data size must be positive")
        if self.payload not in PAYLOAD_KINDS:
            raise ConfigError(
                f"payload must be one of {', '.join(PAYLOAD_KINDS)}, got {self.payload!r}"
            )
        if self.payload == "kv":
            from kvtier.engines.kv_corpus import CHUNK_TOKENS as KV_TOKENS

            if self.model != KV_PAYLOAD_MODEL or self.block_size or self.chunk_tokens != KV_TOKENS:
                raise ConfigError(
                    f"--payload kv is real KV of the embedded model in {KV_TOKENS}-token "
                    f"chunks: use it with --model {KV_PAYLOAD_MODEL}, --chunk-tokens {KV_TOKENS} "
                    "and no --block-size"
                )
        if self.drive not in ("auto", "threads", "native"):
            raise ConfigError(f"drive must be auto, threads or native, got {self.drive!r}")
        if self.repeats < 1:
            raise ConfigError(f"repeats must be at least 1, got {self.repeats}")
        if self.slices < 1:
            raise ConfigError(f"slices must be at least 1, got {self.slices}")
        if self.lookup_chunks <= 0 or self.lookup_repeats <= 0:
            raise ConfigError("lookup chunks and repeats must be positive")
        if self.reference not in REFERENCE_KINDS:
            raise ConfigError(
                f"reference must be one of {', '.join(REFERENCE_KINDS)}, got {self.reference!r}"
            )
        if self.reference == RAW_TWIN:
            for url in self.tiers:
                if url_codec(url) == "raw":
                    raise ConfigError(
                        f"--reference raw compares a tier's codec with none, but {url} has "
                        "no codec (give it codec=kv or codec=zstd)"
                    )

    @property
    def spec(self) -> ModelSpec:
        """The model whose KV geometry shapes the blocks."""
        return get_model(self.model)

    @property
    def block_bytes(self) -> int:
        """Payload bytes per block."""
        if self.block_size is not None:
            return self.block_size
        return int(self.spec.kv_bytes_per_token() * self.chunk_tokens)

    @property
    def blocks(self) -> int:
        """Blocks per pass: the data size in whole blocks, at least one per thread."""
        return max(math.ceil(self.data_size / self.block_bytes), max(self.depths))

    @property
    def block_meta(self) -> BlockMeta:
        """The KV layout (layers, 2, kv_heads, chunk_tokens, head_dim) when it is the block."""
        spec = self.spec
        shape = (spec.layers, 2, spec.kv_heads, self.chunk_tokens, spec.head_dim)
        if (
            self.block_size is None
            and spec.attention != "mla"
            and spec.kv_dtype in DTYPES
            and math.prod(shape) * dtype_bytes(spec.kv_dtype) == self.block_bytes
        ):
            return BlockMeta(spec.kv_dtype, shape)
        return BlockMeta("u8", (self.block_bytes,))

    def as_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return {
            "tiers": list(self.tiers),
            **attrs(self, "model", "chunk_tokens", "block_bytes", "blocks"),
            "data_bytes": self.blocks * self.block_bytes,
            "depths": list(self.depths),
            **attrs(self, "batch", "drive", "min_read_seconds", "repeats", "slices", "fio"),
            "lookup_chunks": self.lookup_chunks if self.lookup else 0,
            "payload": self.payload,
            "reference": self.reference,
        }
