"""The URL options of the S3 tier: ``s3://bucket/prefix?endpoint=http://127.0.0.1:8333&create=1``.

Credentials are never options: they come from the usual environment variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``…).
An object store answers in tens of milliseconds and takes much longer on a first write or in its
tail, so its ``timeout=`` defaults to seconds, and transient failures are retried within it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.tiers.shared import SharedOptions, timeout_option
from kvtier.tiers.url import opt

#: The default bound of one S3 operation, in seconds: object stores' first writes and tails.
S3_TIMEOUT_S = 2.0


@dataclass(frozen=True, kw_only=True)
class S3Options(SharedOptions):
    """What an ``s3://`` URL sets besides its bucket and prefix."""

    timeout: float = timeout_option(S3_TIMEOUT_S)
    retries: int = opt(
        "int",
        2,
        min=0,
        max=10,
        help="times a request is retried after a server error or a dropped connection",
    )

    endpoint: str | None = opt(
        "str", None, example="http://127.0.0.1:8333", help="the S3 server (default: AWS's)"
    )
    region: str | None = opt("str", None, help="the bucket's region (default: AWS_REGION)")
    create: bool = opt("switch", False, help="create the bucket at open when it is missing")
    concurrency: int = opt("int", 16, min=1, help="requests in flight per batch")
    rate: int = opt(
        "size",
        16 * 1024 * 1024,
        min=1024,
        help="bytes per second an operation may be slowed to beyond its timeout",
    )


__all__ = ["S3_TIMEOUT_S", "S3Options"]
