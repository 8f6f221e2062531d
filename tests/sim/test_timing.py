"""Step timers: a measured one fitted from a run's warm-up, a roofline one from specs."""

import pytest

from kvtier.cost.compute import RooflineCompute
from kvtier.errors import ConfigError
from kvtier.sim.measured import fit_timer
from kvtier.sim.timing import MeasuredTimer, RooflineTimer
from kvtier.specs import get_gpu, get_model


def test_a_fit_reproduces_the_warm_up_it_came_from():
    truth = MeasuredTimer(
        step_s=0.06, token_s=5e-4, attention_s=1e-7, request_overhead_s=0.05, chunk_s=0.2
    )
    points = [[n, truth.request_overhead_s + truth.prefill_seconds(n)] for n in (1024, 2048, 4096)]
    fitted = fit_timer({"prefill": {"points": points}, "decode_step_s": 0.06}, 2048, 0.05)
    assert fitted.chunk_s == pytest.approx(0.2, rel=1e-3)
    for n, s in points:
        assert fitted.request_overhead_s + fitted.prefill_seconds(n) == pytest.approx(s, rel=1e-3)


def test_a_warm_up_without_two_lengths_is_refused():
    with pytest.raises(ConfigError):
        fit_timer({"prefill": {"points": [[1024, 1.0]]}, "decode_step_s": 0.06})


def test_roofline_steps_add_up_to_the_compute_models_prefill():
    compute = RooflineCompute(get_model("llama-3.1-8b"), get_gpu("h100"))
    timer = RooflineTimer(compute, budget=2048)
    assert timer.prefill_seconds(8192, 1000) == pytest.approx(compute.prefill_seconds(8192, 1000))
    # a decode step of a small batch is memory-bound: the weights' read
    weights_s = compute.decode_step_bytes(0, 0) / (compute.gpu.hbm_bandwidth * compute.mbu)
    assert timer.step_seconds([], [1]) == pytest.approx(weights_s, rel=0.01)
