"""A server's ``/metrics`` as plain series: parsed from vLLM's text, scraped over real HTTP, and
differenced."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvtier.harness.scrape import metrics_delta, parse_metrics, scrape_metrics

METRICS = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="/m"} 3968.0
vllm:prefix_cache_hits_created{engine="0",model_name="/m"} 1.79e+09
# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="/m",source="local_compute"} 4224.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="/m",source="local_cache_hit"} 3968.0
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="1.0",model_name="/m"} 1.0
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="/m"} 2.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="/m"} 2.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="/m"} 4.25
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/m"} 0.0
# HELP kvtier_hit_tokens_total prompt tokens kvtier held
# TYPE kvtier_hit_tokens_total counter
kvtier_hit_tokens_total{engine="0",model_name="/m",tier="dram"} 512.0
"""


def test_metrics_keep_the_series_of_interest_without_engine_labels():
    m = parse_metrics(METRICS)
    assert m["vllm:prefix_cache_hits_total"] == 3968.0
    assert m["vllm:prompt_tokens_by_source_total{source=local_compute}"] == 4224.0
    assert m["vllm:request_prefill_time_seconds_sum"] == 4.25
    assert m["vllm:request_prefill_time_seconds_bucket{le=+Inf}"] == 2.0
    assert m["kvtier_hit_tokens_total{tier=dram}"] == 512.0
    assert not any(k.endswith("_created") for k in m)
    assert "vllm:num_requests_running" not in m  # a gauge of the moment, not of a phase


def test_metrics_delta_is_what_a_phase_added():
    before = {"a": 1.0, "b": 5.0}
    after = {"a": 4.0, "b": 5.0, "c": 2.0}
    assert metrics_delta(before, after) == {"a": 3.0, "c": 2.0}


@pytest.fixture
def metrics_server():
    """A real HTTP server answering ``/metrics`` with :data:`METRICS` (404 elsewhere)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_scrape_reads_the_servers_series_and_narrower_prefixes_keep_fewer(metrics_server):
    assert scrape_metrics(metrics_server) == parse_metrics(METRICS)
    only = scrape_metrics(metrics_server, prefixes=("kvtier_",))
    assert only == {"kvtier_hit_tokens_total{tier=dram}": 512.0}


def test_a_server_that_cannot_be_read_gives_no_series(metrics_server):
    assert scrape_metrics(metrics_server + "/nothing-here") == {}  # HTTP 404
    server_gone = metrics_server.rsplit(":", 1)[0] + ":9"  # the discard port: nothing listens
    assert scrape_metrics(server_gone, timeout_s=2) == {}
