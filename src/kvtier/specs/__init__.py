"""Model KV geometry and hardware: dataclasses, presets, and loaders for user files."""

from kvtier.specs.hardware import (
    GPU,
    GPUS,
    LINKS,
    STORAGE,
    Link,
    Storage,
    get_gpu,
    get_link,
    get_storage,
)
from kvtier.specs.model import DTYPE_BYTES, MODELS, ModelSpec, get_model, model_from_hf_config
from kvtier.specs.profile import Profile, load_profile
from kvtier.specs.units import GB, TB, GiB, KiB, MiB, format_bytes, parse_size

__all__ = [
    "DTYPE_BYTES",
    "GB",
    "GPU",
    "GPUS",
    "LINKS",
    "MODELS",
    "STORAGE",
    "TB",
    "GiB",
    "KiB",
    "Link",
    "MiB",
    "ModelSpec",
    "Profile",
    "Storage",
    "format_bytes",
    "get_gpu",
    "get_link",
    "get_model",
    "get_storage",
    "load_profile",
    "model_from_hf_config",
    "parse_size",
]
