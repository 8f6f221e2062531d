"""The connector's per-request records (a JSON-lines file), written off vLLM's step loop.

The scheduler half hands each request's line to :class:`RecordWriter`; a background thread
serialises and appends it, so EngineCore's loop never waits on the file. Lines are written in
the order they were handed over; closing (or the interpreter exiting) writes what is pending.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import queue
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

log = logging.getLogger("kvtier.vllm")

_STOP = object()


def prompt_hash(token_ids: Iterable[int]) -> str:
    """xxh3-64 (hex) of token ids as little-endian uint32: how a record names its prompt, and
    how clients join their requests to the connector's records."""
    return xxhash.xxh3_64_hexdigest(np.asarray(list(token_ids), dtype="<u4").tobytes())


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records written to ``path`` so far: one dict per line (a missing file is none; a
    line that is not a JSON object, such as one being written, is skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict):
                out.append(item)
    return out


class RecordWriter:
    """Appends JSON lines to ``path`` from a thread of its own."""

    def __init__(self, path: str):
        self._file = open(path, "a")  # noqa: SIM115 - closed by close()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="kvtier-records", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def write(self, line: dict) -> None:
        """Queue one record (a JSON-serialisable dict); never blocks."""
        if not self._closed:
            self._queue.put(line)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while not self._queue.empty():  # whatever else is pending goes in the same write
                batch.append(self._queue.get())
            lines = [json.dumps(x) + "\n" for x in batch if x is not _STOP]
            try:
                if lines:
                    self._file.write("".join(lines))
                    self._file.flush()
            except (OSError, ValueError) as exc:  # a full disk loses records, never the engine
                log.warning("kvtier records: cannot write (%s)", exc)
            if any(x is _STOP for x in batch):
                return

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending and close the file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self._queue.put(_STOP)
        self._thread.join(timeout)
        try:
            self._file.close()
        except OSError as exc:  # what the failed writes left in the buffer
            log.warning("kvtier records: cannot write (%s)", exc)


__all__ = ["RecordWriter", "prompt_hash"]
