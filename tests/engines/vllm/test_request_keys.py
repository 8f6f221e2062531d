"""Keys of vLLM's own Request objects: every input vLLM folds into its block hashes enters them.

Requests are vLLM's ``Request`` (as its scheduler hands them to the connector) with LoRA
adapters (real adapter folders on disk), cache salts, multimodal items and prompt embeddings;
the scheduler half runs on real tiers, as in test_scheduler.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvtier.engines.vllm.config import ConnectorConfig
from kvtier.engines.vllm.identity import EngineGeometry
from kvtier.engines.vllm.request_keys import AdapterIdentities, UnkeyableRequest, key_inputs
from kvtier.keys import PLAIN, ChunkKeyer, Namespace
from kvtier.testing.cache_conformance import fill_tier

vllm = pytest.importorskip("vllm")
import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from kvtier.engines.vllm.scheduler import SchedulerSide  # noqa: E402

GEOMETRY = EngineGeometry(
    layers=2, kv_heads=1, head_dim=8, block_size=16, dtype="bfloat16", itemsize=2, layout="t"
)
CHUNK = 32
NS = Namespace("test-model", "weights", "bfloat16", 2, 1, 8, layout="t")
TOKENS = list(range(500, 500 + 4 * CHUNK + 3))
KEYER = ChunkKeyer(NS, CHUNK)


def _request(tokens=TOKENS, rid="r1", **kw) -> Request:
    return Request(
        rid, None if tokens is None else list(tokens), SamplingParams(max_tokens=4), None, **kw
    )


def _image(identifier: str | None, offset: int, length: int = 40) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(
        data=None,
        modality="image",
        identifier=identifier,  # type: ignore[arg-type]
        mm_position=PlaceholderRange(offset=offset, length=length),
    )


def _keys(request: Request, adapters: AdapterIdentities | None = None) -> list[bytes]:
    return KEYER.keys(request.all_token_ids, key_inputs(request, adapters or AdapterIdentities()))


@pytest.fixture
def adapters(tmp_path) -> dict[str, Path]:
    """Two adapter folders with the same file names and different weights."""
    out = {}
    for name, fill in (("a", 1), ("b", 2)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
        (folder / "adapter_model.safetensors").write_bytes(bytes([fill]) * 4096)
        out[name] = folder
    return out


def test_a_plain_request_keys_as_plain_token_ids():
    request = _request()
    assert key_inputs(request, AdapterIdentities()) is PLAIN
    assert _keys(request) == KEYER.keys(TOKENS)


def test_different_multimodal_items_behind_equal_token_ids_give_different_keys():
    one = _keys(_request(mm_features=[_image("h1", 40)]))
    other = _keys(_request(mm_features=[_image("h2", 40)]))
    moved = _keys(_request(mm_features=[_image("h1", 41)]))
    plain = KEYER.keys(TOKENS)
    assert one[0] == other[0] == plain[0]  # chunk 0 ends before the image (tokens 40..79)
    for a, b in ((one, other), (one, moved), (one, plain), (other, plain)):
        assert set(a[1:]).isdisjoint(b[1:])
    assert _keys(_request(mm_features=[_image("h1", 40)])) == one


def test_different_prompt_embeddings_give_different_keys_and_equal_ones_equal_keys():
    n = len(TOKENS)
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(n, 16, generator=gen, dtype=torch.float32).to(torch.bfloat16)
    changed = embeds.clone()
    changed[70, 5] += 1  # inside chunk 2
    first = _keys(_request(None, prompt_embeds=embeds))
    assert first == _keys(_request(None, prompt_embeds=embeds.clone()))
    other = _keys(_request(None, prompt_embeds=changed))
    assert first[:2] == other[:2] and set(first[2:]).isdisjoint(other[2:])
    # the placeholder ids (zeros) alone key as a plain prompt of zeros would: never as embeds
    assert set(first).isdisjoint(KEYER.keys([0] * n))
    # a mixed prompt (some positions token ids) is another input than the same embeddings alone
    flags = [i % 2 == 0 for i in range(n)]
    mixed = _keys(_request(TOKENS, prompt_embeds=embeds, prompt_is_token_ids=flags))
    assert set(mixed).isdisjoint(first)


def test_adapters_are_keyed_by_name_path_and_the_bytes_of_their_files(adapters, tmp_path):
    identities = AdapterIdentities()
    a = _keys(_request(lora_request=LoRARequest("a", 1, str(adapters["a"]))), identities)
    b = _keys(_request(lora_request=LoRARequest("b", 2, str(adapters["b"]))), identities)
    # the same name pointed at other weights (another server, a redeployed adapter)
    moved = tmp_path / "a-retrained"
    shutil.copytree(adapters["b"], moved)
    renamed = _keys(_request(lora_request=LoRARequest("a", 1, str(moved))), AdapterIdentities())
    plain = KEYER.keys(TOKENS)
    for x, y in ((a, b), (a, plain), (b, plain), (a, renamed)):
        assert set(x).isdisjoint(y)
    # another process reading the same adapter computes the same keys
    again = _keys(_request(lora_request=LoRARequest("a", 7, str(adapters["a"]))))
    assert again == a


def test_salts_key_the_first_chunk_and_so_the_whole_chain():
    a = _keys(_request(cache_salt="a"))
    b = _keys(_request(cache_salt="b"))
    assert a == _keys(_request(cache_salt="a"))
    assert set(a).isdisjoint(b) and set(a).isdisjoint(KEYER.keys(TOKENS))


@pytest.mark.parametrize(
    "kw",
    [
        {"mm_features": [_image(None, 40)]},
        {"lora_request": LoRARequest("gone", 3, "/nonexistent/kvtier-adapter")},
    ],
    ids=["image-without-hash", "adapter-not-on-this-machine"],
)
def test_an_input_that_cannot_be_keyed_is_refused(kw):
    with pytest.raises(UnkeyableRequest):
        key_inputs(_request(**kw), AdapterIdentities())


@pytest.fixture
def tiers(tmp_path):
    host = f"/dev/shm/kvtier-keys-{uuid.uuid4().hex[:8]}"
    yield f"slab://{host}?size=8MiB", f"slab://{tmp_path}/disk?size=64MiB"
    shutil.rmtree(host, ignore_errors=True)


def _stored_plain(disk_url: str) -> list[bytes]:
    """Plain chunks of TOKENS on the disk tier, keyed as kvtier always keyed plain tokens."""
    keys = KEYER.keys(TOKENS)
    fill_tier(disk_url, NS, keys, GEOMETRY.chunk_bytes(CHUNK))
    return keys


def _step(request: Request, blocks: list[int]) -> SimpleNamespace:
    """vLLM's scheduler output for one new request prefilled whole in this step."""
    new = SimpleNamespace(req_id=request.request_id, num_computed_tokens=0, block_ids=(blocks,))
    cached = SimpleNamespace(
        req_ids=[], resumed_req_ids=set(), new_block_ids=[], num_computed_tokens=[]
    )
    return SimpleNamespace(
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=cached,
        num_scheduled_tokens={request.request_id: request.num_tokens},
        total_num_scheduled_tokens=request.num_tokens,
        preempted_req_ids=None,
    )


def test_plain_blocks_serve_plain_requests_only_and_unkeyable_requests_neither_load_nor_store(
    tiers, adapters, tmp_path
):
    _host, disk = tiers
    keys = _stored_plain(disk)
    records = tmp_path / "records.jsonl"
    config = ConnectorConfig(tiers=tiers, chunk_tokens=CHUNK, preload=False, records=str(records))
    side = SchedulerSide(config, NS, GEOMETRY)
    try:
        plain = _request(rid="plain")
        assert side.get_num_new_matched_tokens(plain, 0) == (4 * CHUNK, True)
        extras = {
            "salt": {"cache_salt": "a"},
            "adapter": {"lora_request": LoRARequest("a", 1, str(adapters["a"]))},
            "mm": {"mm_features": [_image("h1", 0)]},
        }
        for rid, kw in extras.items():
            request = _request(rid=rid, **kw)
            assert side.get_num_new_matched_tokens(request, 0) == (0, False), rid
            side.update_state_after_alloc(request, SimpleNamespace(get_block_ids=lambda: ([],)), 0)
            (job,) = side.build_connector_meta(_step(request, list(range(9)))).stores
            assert set(job.keys).isdisjoint(keys), rid  # stored under its own keys
        bad = _request(rid="bad", mm_features=[_image(None, 0)])
        assert side.get_num_new_matched_tokens(bad, 0) == (0, False)
        side.update_state_after_alloc(bad, SimpleNamespace(get_block_ids=lambda: ([],)), 0)
        assert side.build_connector_meta(_step(bad, list(range(9)))).stores == []
        stats = side.take_stats()
        assert stats is not None and stats.data["counts"]["unkeyable_requests"] == 1
    finally:
        side.close()
    lines = {
        r["req_id"]: r for r in map(__import__("json").loads, records.read_text().splitlines())
    }
    assert lines["bad"]["unkeyable"] and lines["bad"]["key_inputs"] == []
    assert lines["salt"]["key_inputs"] == ["salt"] and lines["salt"]["unkeyable"] is None
    assert lines["adapter"]["key_inputs"] == ["adapter"] and lines["mm"]["key_inputs"] == ["mm"]
