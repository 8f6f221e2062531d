"""GPUDirect Storage through kvikio: the disk tier's device verbs on CUDA memory. Only a GPU
with kvikio runs these (``scripts/gpu_check.sh`` on a lent device machine); on CPU the same
verbs are checked over POSIX in ``test_per_block_device``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("GDS needs a CUDA device", allow_module_level=True)
pytest.importorskip("kvikio")

from kvtier.codec import BlockMeta, CorruptBlockError  # noqa: E402
from kvtier.testing.tier_conformance import NS_A, make_key  # noqa: E402
from kvtier.tiers import open_tier  # noqa: E402
from kvtier.tiers.io.buffers import PAGE, aligned_array  # noqa: E402

META = BlockMeta("bf16", (8, 4096))


def test_gds_round_trip_damage_and_the_host_path(tmp_path) -> None:
    tier = open_tier(f"file://{tmp_path}?size=64MiB&gds=1&codec=raw", NS_A)
    try:
        keys = [make_key(i) for i in range(6)]
        srcs = [torch.randn(8, 4096, device="cuda").to(torch.bfloat16) for _ in keys]
        assert tier.write_device([(k, s, META) for k, s in zip(keys, srcs, strict=True)]) == [
            True
        ] * len(keys)
        outs = [torch.empty_like(s) for s in srcs]
        headers = tier.read_device(keys, outs)
        assert all(h is not None and h.digest is not None for h in headers)
        for o, s in zip(outs, srcs, strict=True):
            assert torch.equal(o.view(torch.int16), s.view(torch.int16))
        host = aligned_array(srcs[0].numel() * 2)
        assert tier.get_into(keys[0], host) is not None
        assert bytes(host) == bytes(srcs[0].view(torch.uint8).cpu().numpy())
        with open(tier.block_path(keys[1]), "r+b") as f:
            f.seek(PAGE + 4000)
            b = f.read(1)[0]
            f.seek(PAGE + 4000)
            f.write(bytes([b ^ 1]))
        (bad,) = tier.read_device([keys[1]], [outs[1]])
        assert isinstance(bad, CorruptBlockError)  # caught by the digest computed on the GPU
    finally:
        tier.close()
