"""The Redis tier's command packer sends a value given in pieces exactly as one joined value."""

from __future__ import annotations

from redis.connection import Encoder, PythonRespSerializer

from kvtier.tiers.redis.connection import Pieces, PiecesPacker


def _wire(chunks) -> bytes:
    return b"".join(bytes(c) for c in chunks)


def test_pieces_go_out_as_the_joined_value_would():
    encode = Encoder("utf-8", "strict", False).encode
    ours, theirs = PiecesPacker(6000, encode), PythonRespSerializer(6000, encode)
    header, payload = b"H" * 96, bytes(range(256)) * 40
    sent = ours.pack("SET", "kvtier:{ns:key}", Pieces((header, memoryview(payload))), "PX", 5)
    assert _wire(sent) == _wire(theirs.pack("SET", "kvtier:{ns:key}", header + payload, "PX", 5))
    assert any(isinstance(c, memoryview) for c in sent)  # the payload itself, not a copy


def test_commands_without_pieces_are_packed_by_redis_py():
    encode = Encoder("utf-8", "strict", False).encode
    ours, theirs = PiecesPacker(6000, encode), PythonRespSerializer(6000, encode)
    assert _wire(ours.pack("CONFIG GET", "maxmemory")) == _wire(
        theirs.pack("CONFIG GET", "maxmemory")
    )
