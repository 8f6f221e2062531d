"""The S3 tier: one object per block on any S3-compatible store, through obstore.

Objects are named ``<url prefix>/<prefix>/<namespace>/<key>`` (hex). A batch of gets, heads or
puts runs concurrently (``concurrency=`` in flight) on threads the tier owns, each making
obstore's blocking calls (which release the GIL; they cost less per request than obstore's
asyncio calls on an event loop); a batch of one runs in the caller's thread. The whole batch is
bounded: ``timeout=`` seconds per round of requests plus its bytes at ``rate=``. obstore retries
a request after a server error or a dropped connection (``retries=`` times, with backoff), each
attempt given its share of the bound (a store object per bound, made once); past the bound the
batch raises TimeoutError, and any other failure of the store raises TierUnavailableError.
obstore sends large objects in multipart uploads by itself. With ``ttl=``, an object older than
that is a miss (S3 keeps it until the bucket's lifecycle rules remove it).

At open the bucket is checked with one signed HEAD request: a missing bucket is a clear error
unless ``create=1`` (then it is created), as are refused credentials and a server that does not
answer. Credentials come from the environment (``AWS_ACCESS_KEY_ID``…) and are never logged;
with an ``endpoint=`` and no ``AWS_ACCESS_KEY_ID`` the requests go unsigned (anonymous).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from functools import partial

import obstore
import obstore.exceptions
from obstore.store import S3Store

from kvtier.codec import BlockError, BlockHeader, BlockMeta, pack_block
from kvtier.errors import ConfigError, TierUnavailableError
from kvtier.tiers.base import TierURL, TierUsage
from kvtier.tiers.s3.options import S3Options
from kvtier.tiers.shared import SharedTier, key_of, open_or_degrade
from kvtier.tiers.url import parse_options

_OPEN_TIMEOUT_S = 2.0
_FIRST_GUESS = 1 << 20  # bytes of a block before the tier has seen one
_BOUND_STEP_MS = 50  # bounds up to 1 s round up to this, longer ones to a power of two of ms
_BACKOFF_MS = 10  # the first retry's wait; each later one doubles it


class S3Tier(SharedTier):
    """KV blocks as S3 objects, shared by every process that opens the same bucket and prefix."""

    scheme = "s3"
    Options = S3Options

    def __init__(
        self, namespace: bytes, bucket: str, path: str = "", options: S3Options | None = None
    ):
        self.options = o = options or S3Options()
        super().__init__(namespace, o.name or "s3", o.codec)
        if len(bucket) < 3:
            raise ConfigError(f"s3:// bucket name {bucket!r} is too short (3 characters at least)")
        self.bucket = bucket
        self.root = "/".join(p for p in (path.strip("/"), o.prefix, namespace.hex()) if p)
        self._largest = _FIRST_GUESS
        config: dict = {}
        if o.endpoint:
            config["endpoint"] = o.endpoint
        if o.region:
            config["region"] = o.region
        self._anonymous = bool(o.endpoint and not os.environ.get("AWS_ACCESS_KEY_ID"))
        if self._anonymous:
            # No credentials for a store of one's own: anonymous requests, never a probe of a
            # cloud's instance-metadata address for credentials.
            config["skip_signature"] = True
        client = {
            "timeout": "30s",
            "connect_timeout": f"{max(1, int(o.timeout * 1000))}ms",
            "allow_http": bool(o.endpoint and o.endpoint.startswith("http://")),
        }
        retry = {
            "max_retries": o.retries,
            "retry_timeout": timedelta(seconds=o.timeout),
            "backoff": {"init_backoff": timedelta(milliseconds=_BACKOFF_MS), "base": 2},
        }
        self._store_args = (bucket, config, client, retry)
        self._bounded: dict[int, S3Store] = {}
        try:
            self._store = S3Store(bucket, config=config, client_options=client, retry_config=retry)
        except Exception as exc:  # obstore's config errors carry no credentials
            raise ConfigError(f"s3:// tier for bucket {bucket!r}: {_brief(exc)}") from None
        self._pool = ThreadPoolExecutor(o.concurrency, thread_name_prefix="kvtier-s3")
        where = f"the {self.name} tier (s3://{bucket} at {o.endpoint or 'AWS'})"
        self.degraded = open_or_degrade(where, o.optional, lambda: self._check_bucket(where))

    @classmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> S3Tier:
        options = parse_options(S3Options, url)
        if not url.netloc:
            raise ConfigError(
                "s3:// tier URL needs a bucket, e.g. s3://kv-cache/prefix?endpoint=http://127.0.0.1:8333"
            )
        return cls(namespace, url.netloc, url.path, options)

    # --- open ---------------------------------------------------------------------------
    def _signed(self, method: str) -> int:
        """The HTTP status of a signed ``method`` request on the bucket itself."""
        if self._anonymous:
            url = f"{self.options.endpoint.rstrip('/')}/{self.bucket}/"
        else:
            url = obstore.sign(self._store, method, "", timedelta(minutes=5))
        request = urllib.request.Request(url, method=method, data=b"" if method == "PUT" else None)
        try:
            with urllib.request.urlopen(
                request, timeout=max(_OPEN_TIMEOUT_S, self.options.timeout)
            ) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def _check_bucket(self, where: str) -> None:
        try:
            status = self._signed("HEAD")
            if status == 404 and self.options.create:
                status = self._signed("PUT")
                if status in (200, 409):
                    status = self._signed("HEAD")
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TierUnavailableError(
                f"{where} does not answer ({_brief(reason)}); start it or fix endpoint="
            ) from None
        if status == 404:
            raise TierUnavailableError(
                f"{where}: no bucket {self.bucket!r}; create it, or add create=1 to the URL"
            )
        if status in (401, 403):
            raise TierUnavailableError(
                f"{where} refused the credentials (HTTP {status}); "
                "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        if status >= 300:
            raise TierUnavailableError(f"{where} answered HTTP {status} for the bucket")

    # --- running batches ----------------------------------------------------------------
    def _within(self, seconds: float) -> S3Store:
        """The store whose HTTP client gives each attempt of a request its share of ``seconds``
        (rounded up: a few store objects, each with its connections, not one per batch size)."""
        attempt = seconds / (1 + self.options.retries)
        ms = max(_BOUND_STEP_MS, -(-int(attempt * 1000) // _BOUND_STEP_MS) * _BOUND_STEP_MS)
        if ms > 1000:  # long bounds (large batches) in powers of two: a few stores in all
            ms = 1 << (ms - 1).bit_length()
        store = self._bounded.get(ms)
        if store is None:
            bucket, config, client, retry = self._store_args
            options = client | {"timeout": f"{ms}ms"}
            store = S3Store(bucket, config=config, client_options=options, retry_config=retry)
            self._bounded = self._bounded | {ms: store}  # a new dict: readers need no lock
        return store

    def _run(self, calls: Sequence[Callable[[S3Store], object]], nbytes: int) -> list:
        """Run ``calls`` on the tier's threads, bounded by the timeout and the bytes; their
        results in order (the first error raises)."""
        if not calls:
            return []
        o = self.options
        rounds = -(-len(calls) // o.concurrency)
        deadline = o.timeout * rounds + nbytes / o.rate
        store = self._within(deadline)
        if len(calls) == 1:
            try:
                return [calls[0](store)]
            except TimeoutError:
                raise TimeoutError(
                    f"{self.name}: an S3 request took over {deadline:.3f} s"
                ) from None
            except obstore.exceptions.BaseError as exc:
                raise self._failed(exc) from None
        futures = [self._pool.submit(c, store) for c in calls]
        done, pending = wait(futures, deadline, return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                for p in pending:
                    p.cancel()
                exc = f.exception()
                if isinstance(exc, obstore.exceptions.BaseError):
                    raise self._failed(exc) from None
                raise exc
        if pending:
            for p in pending:
                p.cancel()
            raise TimeoutError(f"{self.name}: {len(calls)} S3 requests took over {deadline:.3f} s")
        return [f.result() for f in futures]

    def _failed(self, exc: Exception) -> TierUnavailableError:
        """A store's error as the tier's own: its first line, never a credential."""
        return TierUnavailableError(f"{self.name}: the S3 store failed a request: {_brief(exc)}")

    @property
    def store(self) -> S3Store:
        """The obstore store of the bucket (object paths: :meth:`path_of`)."""
        return self._store

    def path_of(self, key: bytes) -> str:
        """The object path (within the bucket) of a block."""
        return f"{self.root}/{key.hex()}"

    def _fresh(self, meta) -> bool:
        ttl = self.options.ttl
        if not ttl:
            return True
        modified = meta.get("last_modified") if meta else None
        return modified is None or (datetime.now(UTC) - modified).total_seconds() <= ttl

    def _head(self, key: bytes, store: S3Store):
        try:
            return obstore.head(store, self.path_of(key))
        except FileNotFoundError:
            return None

    def _get(self, key: bytes, store: S3Store):
        try:
            result = obstore.get(store, self.path_of(key))
        except FileNotFoundError:
            return None
        if not self._fresh(result.meta):
            return None
        return result.bytes()

    def _put(self, key: bytes, data: bytes, store: S3Store) -> None:
        obstore.put(store, self.path_of(key), data)

    def _delete(self, key: bytes, store: S3Store) -> None:
        obstore.delete(store, self.path_of(key))

    # --- batched verbs ------------------------------------------------------------------
    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        metas = self._run([partial(self._head, k) for k in keys], 0)
        return [m is not None and self._fresh(m) for m in metas]

    def _get_many(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        values = self._run([partial(self._get, k) for k in keys], len(keys) * self._largest)
        for value in values:
            if value is not None and len(value) > self._largest:
                self._largest = len(value)
        return self._decode_all(keys, values, outs)

    def put_many(self, items: Sequence[tuple[bytes, object, BlockMeta]]) -> list[bool]:
        items = self._coded_items(items)
        encoded = self._encode_all(self._object_of, items)
        nbytes = sum(len(d) for _, d in encoded)
        for _, data in encoded:
            self._largest = max(self._largest, len(data))
        self._run([partial(self._put, k, d) for k, d in encoded], nbytes)
        return [True] * len(encoded)

    def _object_of(self, key: bytes, payload, meta: BlockMeta) -> tuple[bytes, bytes]:
        """(key, one block as the bytes of one object: its header, then its stored payload);
        obstore takes one buffer per object."""
        header, stored = pack_block(self.namespace, key, payload, meta)
        return key, b"".join((header, stored))

    def delete_many(self, keys: Sequence[bytes]) -> list[bool]:
        present = self.contains_many(keys)
        gone = [k for k, p in zip(keys, present, strict=True) if p]
        self._run([partial(self._delete, k) for k in gone], 0)
        return present

    # --- listing ------------------------------------------------------------------------
    def _objects(self) -> list[dict]:
        def listing() -> list[dict]:
            out: list[dict] = []
            for chunk in obstore.list(self._store, prefix=self.root + "/"):
                out.extend(chunk)
            return out

        future = self._pool.submit(listing)
        try:
            return future.result(max(5.0, 10 * self.options.timeout))
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.name}: listing the bucket took too long") from None
        except obstore.exceptions.BaseError as exc:
            raise self._failed(exc) from None

    def iter_keys(self) -> Iterator[bytes]:
        keys = [key_of(m["path"]) for m in self._objects() if self._fresh(m)]
        return iter([k for k in keys if k is not None])

    def usage(self) -> TierUsage:
        """Blocks and bytes of this namespace in the bucket (a LIST: one pass over them)."""
        objects = [m for m in self._objects() if self._fresh(m)]
        notes = (f"degraded at open: {self.degraded}",) if self.degraded else ()
        return TierUsage(sum(m["size"] for m in objects), 0, len(objects), notes)

    def close(self) -> None:
        self._decoders.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _brief(exc: object) -> str:
    text = str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


__all__ = ["S3Tier"]
