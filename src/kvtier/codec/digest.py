"""A payload checksum that any device computes with plain integer sums: what lets a block read
straight into GPU memory be verified where it landed.

The words of the payload (little-endian 64-bit, the last one zero-padded) give two sums modulo
2**64: ``s1 = Σ w[i]`` and ``s2 = Σ (i + 1) · w[i]``; the digest is ``s1 ^ rotl(s2, 32)``. A flipped
bit changes ``s1``, swapped or shifted words change ``s2`` (Fletcher's idea on 64-bit words). It
guards against damage, not against an adversary, like the xxh3 it stands beside.
"""

from __future__ import annotations

import numpy as np

MASK = (1 << 64) - 1


def combine(s1: int, s2: int) -> int:
    """The digest of the two sums (each taken modulo 2**64)."""
    s1, s2 = s1 & MASK, s2 & MASK
    return s1 ^ (((s2 << 32) | (s2 >> 32)) & MASK)


def payload_digest(*parts) -> int:
    """The digest of host buffers' bytes, in order, as one payload (numpy, any lengths): parts
    of whole words are summed where they lie, a payload split elsewhere is joined first."""
    views = [memoryview(p).cast("B") for p in parts]
    if any(v.nbytes % 8 for v in views[:-1]):
        views = [memoryview(b"".join(views))]
    s1 = s2 = 0
    start = 0  # words before this part
    for view in views:
        words = _words(view)
        if words.size:
            with np.errstate(over="ignore"):
                a = int(words.sum(dtype=np.uint64))
                b = int(np.dot(words, np.arange(1, words.size + 1, dtype=np.uint64)))
            s1, s2 = s1 + a, s2 + b + start * a  # Σ (start + j + 1) · w[j]
            start += words.size
    return combine(s1, s2)


def _words(view: memoryview) -> np.ndarray:
    """A buffer's little-endian 64-bit words, the last one zero-padded."""
    n = view.nbytes
    if not n % 8:
        return np.frombuffer(view, "<u8")
    padded = np.zeros(-(-n // 8) * 8, np.uint8)
    padded[:n] = np.frombuffer(view, np.uint8)
    return padded.view("<u8")


def tensor_digest(flat) -> int:
    """The digest of a contiguous torch tensor's bytes, computed on the tensor's device (one
    synchronisation, for the two sums)."""
    return tensor_digests([flat])[0]


def tensor_digests(tensors) -> list[int]:
    """The digests of several tensors on one device, with one synchronisation for them all."""
    import torch

    sums = [s for t in tensors for s in _sums(t)]
    if not sums:
        return []
    values = torch.stack(sums).tolist()
    return [combine(values[2 * i], values[2 * i + 1]) for i in range(len(tensors))]


def _sums(flat):
    """The two sums of a tensor's 64-bit words, as 0-d int64 tensors on its device."""
    import torch

    raw = flat.reshape(-1).view(torch.uint8)
    n = raw.numel()
    if n == 0:
        zero = torch.zeros((), dtype=torch.int64, device=raw.device)
        return zero, zero
    if n % 8 or raw.data_ptr() % 8:
        padded = torch.zeros(-(-n // 8) * 8, dtype=torch.uint8, device=raw.device)
        padded[:n] = raw
        raw = padded
    words = raw.view(torch.int64)  # two's complement: sums agree with uint64 modulo 2**64
    weights = torch.arange(1, words.numel() + 1, dtype=torch.int64, device=words.device)
    return words.sum(), (words * weights).sum()


__all__ = ["MASK", "combine", "payload_digest", "tensor_digest", "tensor_digests"]
