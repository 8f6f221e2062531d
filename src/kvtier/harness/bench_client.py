"""vLLM's own serving benchmark client (``vllm.benchmarks.serve``), unmodified, as a worker.

    python -m kvtier.harness.bench_client

imports the client once (it takes tens of seconds on a small CPU), writes ``{"ready": true}``
on stdout, then reads one JSON array of client arguments per stdin line — exactly what
``vllm bench serve`` takes after ``bench serve`` — runs the client's ``main`` with them and
answers one JSON line: ``{"ok": true}`` or ``{"ok": false, "error": "..."}``. Everything the
client and vLLM print (file descriptor 1 included) goes to stderr, so stdout carries only the
answers; the client's results are the files it saves (``--save-result``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import IO, Any


def client_parser() -> Any:
    """vLLM's argument parser of ``vllm bench serve``."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    return parser


def _cpu_platform() -> None:
    """What ``vllm bench`` does first: an unspecified platform becomes the CPU one."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


def run_client(argv: Sequence[str]) -> dict[str, Any]:
    """Run vLLM's client with ``argv``; its result dict (also saved with ``--save-result``)."""
    from vllm.benchmarks.serve import main

    _cpu_platform()
    args = client_parser().parse_args(list(argv))
    return main(args)


def _reply(out: IO[str], payload: dict[str, Any]) -> None:
    out.write(json.dumps(payload) + "\n")
    out.flush()


def serve(stdin: IO[str], stdout: IO[str]) -> None:
    """Answer one client run per line of ``stdin`` until it closes."""
    client_parser()  # the import, before saying ready
    _reply(stdout, {"ready": True})
    for line in stdin:
        if not line.strip():
            continue
        try:
            argv = json.loads(line)
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ValueError("a JSON array of strings")
            run_client(argv)
        except SystemExit as exc:  # argparse refusing the arguments
            _reply(stdout, {"ok": False, "error": f"the client exited with {exc.code}"})
        except Exception as exc:
            _reply(stdout, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        else:
            _reply(stdout, {"ok": True})


def main() -> None:
    """The worker: answers on the original stdout, which everything else no longer reaches."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
