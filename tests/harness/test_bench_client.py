"""The worker around vLLM's benchmark client: ready, then one answer per line of arguments."""

from __future__ import annotations

import io
import json

from kvtier.harness import bench_client


def test_worker_answers_each_line(monkeypatch):
    seen: list[list[str]] = []

    def run_client(argv):
        seen.append(argv)
        if "--boom" in argv:
            raise ValueError("no such dataset")
        if "--bad" in argv:
            raise SystemExit(2)
        return {}

    monkeypatch.setattr(bench_client, "client_parser", lambda: None)
    monkeypatch.setattr(bench_client, "run_client", run_client)
    lines = [["--num-prompts", "4"], ["--boom"], ["--bad"], {"not": "a list"}]
    stdin = io.StringIO("\n".join(json.dumps(x) for x in lines) + "\n\nnot json\n")
    stdout = io.StringIO()
    bench_client.serve(stdin, stdout)
    answers = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert answers[0] == {"ready": True}
    assert answers[1] == {"ok": True}
    assert answers[2] == {"ok": False, "error": "ValueError: no such dataset"}
    assert answers[3] == {"ok": False, "error": "the client exited with 2"}
    assert answers[4]["ok"] is False and "array of strings" in answers[4]["error"]
    assert answers[5]["ok"] is False and "JSONDecodeError" in answers[5]["error"]
    assert seen == [["--num-prompts", "4"], ["--boom"], ["--bad"]]
