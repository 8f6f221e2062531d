"""The Redis/Valkey tier: blocks as string values, pipelined, on one server or a Redis Cluster.

Key names carry the prefix, namespace and key (``kvtier:{<namespace>:<key>}``; the braces are a
cluster hash tag, so the parts of a split block share a slot). A block larger than
``max_value`` is split over ``<name>:1``, ``<name>:2``…; the first part starts with the
container's header, whose stored length says how many parts to read. A part that was dropped,
overwritten half-way or never written fails the checksum: a counted miss.

Every batched verb is one or two pipelines of ``batch`` commands. A server that refuses a write
(``maxmemory`` with ``noeviction``: an OOM error) makes that put return False and counts it in
:attr:`RedisTier.refused_puts`; reads go on. A connection error or a timeout raises, so the
cache skips the tier for its back-off.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from kvtier.codec import HEADER_SIZE, BlockError, BlockHeader, BlockMeta, pack_block, parse_header
from kvtier.codec.parallel import EncodeAhead
from kvtier.errors import ConfigError, TierUnavailableError
from kvtier.tiers.base import TierURL, TierUsage
from kvtier.tiers.io.buffers import BufferPool
from kvtier.tiers.redis.connection import Pieces, ValueConnection, ValueSSLConnection
from kvtier.tiers.redis.direct_read import WINDOW_BYTES, Coded, byte_windows, read_values
from kvtier.tiers.redis.options import RedisOptions
from kvtier.tiers.shared import SharedTier, batches, key_of, open_or_degrade
from kvtier.tiers.url import parse_options

SCHEMES = ("redis", "rediss", "valkey")


class RedisTier(SharedTier):
    """KV blocks in Redis or Valkey, shared by every process that opens the same server."""

    scheme = "redis"
    Options = RedisOptions

    def __init__(
        self,
        namespace: bytes,
        host: str = "127.0.0.1",
        port: int = 6379,
        db: int = 0,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: bool = False,
        options: RedisOptions | None = None,
    ):
        self.options = o = options or RedisOptions()
        super().__init__(namespace, o.name or "redis", o.codec)
        self.address = f"{host}:{port}/{db}"
        self.refused_puts = 0
        self._count_lock = threading.Lock()
        self._tag = f"{o.prefix}:{{{namespace.hex()}:"
        kwargs = dict(
            socket_timeout=o.timeout,
            socket_connect_timeout=o.timeout,
            retry=Retry(NoBackoff(), 0),
            username=username,
            password=password,
            health_check_interval=0,
        )
        if tls:
            kwargs |= dict(ssl_ca_certs=o.ca, ssl_cert_reqs="required" if o.verify else "none")
            if not o.verify:
                kwargs["ssl_check_hostname"] = False
        kwargs["connection_class"] = ValueSSLConnection if tls else ValueConnection
        what = f"the {self.name} tier (redis at {self.address})"
        if o.cluster and db != 0:
            raise ConfigError("a Redis Cluster has only database 0; drop the /db from the URL")
        self._args = dict(host=host, port=port, **kwargs) | ({} if o.cluster else {"db": db})
        self._client = None
        self._client_lock = threading.Lock()
        self.degraded = open_or_degrade(what, o.optional, lambda: self._connect(what))

    @classmethod
    def from_url(cls, url: TierURL, namespace: bytes) -> RedisTier:
        if url.scheme not in SCHEMES:
            raise ConfigError(f"not a redis URL: {url.scheme}://")
        options = parse_options(RedisOptions, url)
        parts = urlsplit(f"//{url.netloc}")
        try:
            port = parts.port or 6379
        except ValueError:
            raise ConfigError(
                f"{url.scheme}:// tier URL has a bad port in {parts.hostname!r}"
            ) from None
        db_text = url.path.strip("/") or "0"
        if not db_text.isdigit():
            raise ConfigError(
                f"{url.scheme}:// tier URL: the path is the database number, not {db_text!r}"
            )
        return cls(
            namespace,
            parts.hostname or "127.0.0.1",
            port,
            int(db_text),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=url.scheme == "rediss",
            options=options,
        )

    # --- connection -------------------------------------------------------------------
    def _connect(self, what: str) -> None:
        try:
            self.client.ping()
        except AuthenticationError:
            raise TierUnavailableError(
                f"{what} refused the credentials; check the URL's user and password"
            ) from None
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise TierUnavailableError(
                f"{what} does not answer ({type(exc).__name__}: {_brief(exc)}); "
                "start it or fix the URL"
            ) from None
        except ResponseError as exc:
            raise TierUnavailableError(f"{what} refused PING: {_brief(exc)}") from None

    @property
    def client(self):
        """The redis-py client (``Redis``, or ``RedisCluster`` made once the cluster answers)."""
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    if self.options.cluster:
                        from redis.cluster import RedisCluster

                        args = dict(self._args)  # cluster nodes make their own pools
                        ssl = args.pop("connection_class") is ValueSSLConnection
                        self._client = RedisCluster(**args, ssl=ssl)
                    else:
                        pool = redis.ConnectionPool(**self._args)
                        self._client = redis.Redis(connection_pool=pool)
                client = self._client
        return client

    def stock_client(self):
        """A new redis-py client to the same server with the same options, as redis-py comes
        (its own packer and parser, its own connections): what benchmarks compare against."""
        args = dict(self._args)
        ssl = args.pop("connection_class") is ValueSSLConnection
        if self.options.cluster:
            from redis.cluster import RedisCluster

            return RedisCluster(**args, ssl=ssl)
        return redis.Redis(**args, ssl=ssl)

    def _pipe(self):
        return self.client.pipeline(transaction=False)

    def name_of(self, key: bytes, part: int = 0) -> str:
        """The Redis key of a block's ``part``-th value."""
        base = f"{self._tag}{key.hex()}}}"
        return base if part == 0 else f"{base}:{part}"

    def _parts(self, total: int) -> int:
        return max(1, -(-total // self.options.max_value))

    # --- batched verbs ---------------------------------------------------------------
    def contains_many(self, keys: Sequence[bytes]) -> list[bool]:
        out: list[bool] = []
        for run in batches(keys, self.options.batch):
            pipe = self._pipe()
            for key in run:
                pipe.exists(self.name_of(key))
            out += [bool(n) for n in pipe.execute()]
        return out

    def _get_many(
        self, keys: Sequence[bytes], outs: Sequence
    ) -> list[BlockHeader | BlockError | None]:
        results: list[BlockHeader | BlockError | None] = []
        for run, run_outs in zip(
            batches(keys, self.options.batch), batches(outs, self.options.batch), strict=True
        ):
            if not self.options.cluster:
                results += self._read_direct(run, run_outs)
                continue
            # a window of replies per pipeline: a server writes none before it has copied all
            sizes = [memoryview(o).nbytes for o in run_outs]
            for a, b in byte_windows(sizes, WINDOW_BYTES):
                pipe = self._pipe()
                for key in run[a:b]:
                    pipe.get(self.name_of(key))
                values = self._whole(run[a:b], pipe.execute())
                results += self._decode_all(run[a:b], values, run_outs[a:b])
        return results

    def _read_direct(self, keys: Sequence[bytes], outs: Sequence) -> list:
        """One batch of GETs whose replies land in ``outs`` (see :mod:`.direct_read`); a block
        split over several values takes the general path."""
        pool = self.client.connection_pool
        conn = pool.get_connection()
        started: list[Future] = []  # coded blocks decode while the next replies arrive

        def decode(block: Coded) -> Future:
            started.append(self._decoders.submit(self._finish, block))
            return started[-1]

        try:
            got = read_values(
                conn,
                [self.name_of(k) for k in keys],
                keys,
                outs,
                self.namespace,
                coded=decode,
                stage=self._staging.take,
            )
        except BaseException:
            conn.disconnect()  # possibly mid-reply: never back in use as it is
            wait(started)  # no decode may write into the caller's buffers after this returns
            raise
        finally:
            pool.release(conn)
        for i, value in enumerate(got):
            if isinstance(value, Future):
                got[i] = value.result()
        for i, value in enumerate(got):
            if isinstance(value, bytes):
                (whole,) = self._whole([keys[i]], [value])
                got[i] = self._decode_into(keys[i], whole, outs[i])
        return got

    def _finish(self, block: Coded) -> BlockHeader | BlockError:
        """Check and decode a coded block read off the wire, then give its staging back."""
        try:
            return block.finish()
        finally:
            if block.lent is not None:
                self._staging.give(block.lent)

    @functools.cached_property
    def _staging(self) -> BufferPool:
        """Buffers coded blocks land in until decoded (reused: no fresh pages per read)."""
        return BufferPool(keep=4 * self._decoders.threads)

    def _whole(self, keys: Sequence[bytes], firsts: list) -> list:
        """The whole stored objects: the parts of a split block are read again, all in one
        transaction, so a concurrent overwrite cannot mix two versions."""
        values = list(firsts)
        for i, first in enumerate(firsts):
            parts = self._stored_parts(first)
            for _ in range(3):
                if parts == 1:
                    break
                tx = self.client.pipeline(transaction=True)
                for p in range(parts):
                    tx.get(self.name_of(keys[i], p))
                chunks = tx.execute()
                now = self._stored_parts(chunks[0])
                if now == parts or chunks[0] is None:
                    values[i] = None if chunks[0] is None else b"".join(c or b"" for c in chunks)
                    break
                parts = now  # overwritten in between with another size: read again
            else:
                values[i] = None
        return values

    def put_many(self, items: Sequence[tuple[bytes, object, BlockMeta]]) -> list[bool]:
        items = self._coded_items(items)
        if len(items) == 1 and not self.options.cluster:  # the common case, kept short
            key, payload, meta = items[0]
            header, stored = pack_block(self.namespace, key, payload, meta)
            if len(header) + stored.nbytes <= self.options.max_value:
                px = int(self.options.ttl * 1000) or None
                try:
                    self.client.set(self.name_of(key), Pieces((header, stored)), px=px)
                except ResponseError:  # refused (e.g. OOM under noeviction)
                    with self._count_lock:
                        self.refused_puts += 1
                    return [False]
                return [True]
        out: list[bool] = []
        decoders = self._decoders
        if self.codec == "raw" or not decoders.parallel:
            for run in batches(items, self.options.batch):
                out += self._put_run(run, self._encode_all(self._packed, run))
            return out
        # coded blocks encode on the codec threads a few ahead while earlier ones are sent, a
        # pipeline of as many blocks as there are threads at a time
        ahead = EncodeAhead(
            decoders, range(len(items)), lambda i: self._packed(*items[i]), 2 * decoders.threads
        )
        try:
            step = min(self.options.batch, decoders.threads)
            for a in range(0, len(items), step):
                run = items[a : a + step]
                out += self._put_run(run, [ahead.get(i) for i in range(a, a + len(run))])
        finally:
            ahead.cancel()
        return out

    def _packed(self, key: bytes, payload, meta: BlockMeta) -> tuple[bytes, memoryview]:
        return pack_block(self.namespace, key, payload, meta)

    def _put_run(
        self,
        run: Sequence[tuple[bytes, object, BlockMeta]],
        packed: Sequence[tuple[bytes, memoryview]],
    ) -> list[bool]:
        """One pipeline (or one command) for the blocks of one value (``packed``: each one's
        header and stored payload); one transaction per split block."""
        o = self.options
        px = int(o.ttl * 1000) or None
        replies: list = [None] * len(run)
        split: list[tuple[int, bytes]] = []
        single: list[tuple[int, str, object]] = []
        for i, ((key, _, _), (header, stored)) in enumerate(zip(run, packed, strict=True)):
            if len(header) + stored.nbytes > o.max_value:
                split.append((i, b"".join((header, stored))))
            else:
                single.append((i, self.name_of(key), self._value(header, stored)))
        if len(single) == 1:  # one command costs less without a pipeline
            i, name, value = single[0]
            try:
                replies[i] = [self.client.set(name, value, px=px)]
            except ResponseError as exc:  # refused (e.g. OOM under noeviction)
                replies[i] = [exc]
        elif single:
            pipe = self._pipe()
            for _, name, value in single:
                pipe.set(name, value, px=px)
            for (i, _, _), reply in zip(single, pipe.execute(raise_on_error=False), strict=True):
                replies[i] = [reply]
        for i, data in split:
            tx = self.client.pipeline(transaction=True)
            for p in range(self._parts(len(data))):
                tx.set(
                    self.name_of(run[i][0], p), data[p * o.max_value : (p + 1) * o.max_value], px=px
                )
            try:
                replies[i] = tx.execute(raise_on_error=False)
            except ResponseError as exc:  # EXECABORT: the server refused the whole transaction
                replies[i] = [exc]
        out: list[bool] = []
        for answers in replies:
            for err in answers:
                if isinstance(err, Exception) and not isinstance(err, ResponseError):
                    raise err
            out.append(not any(isinstance(a, Exception) for a in answers))
        refused = out.count(False)
        if refused:
            with self._count_lock:
                self.refused_puts += refused
        return out

    def _value(self, header: bytes, stored: memoryview):
        """A SET's value: header and payload sent from their own buffers (a cluster client,
        whose connections use redis-py's packer, gets them joined)."""
        if self.options.cluster:
            return b"".join((header, stored))
        return Pieces((header, stored))

    def delete_many(self, keys: Sequence[bytes]) -> list[bool]:
        out: list[bool] = []
        for run in batches(keys, self.options.batch):
            pipe = self._pipe()
            for key in run:
                pipe.getrange(self.name_of(key), 0, HEADER_SIZE - 1)
            heads = pipe.execute()
            pipe = self._pipe()
            split: list[tuple[bytes, int]] = []
            for key, head in zip(run, heads, strict=True):
                parts = self._stored_parts(head)
                if parts > 1:
                    split.append((key, parts))
                else:
                    pipe.delete(self.name_of(key))
            removed = iter(pipe.execute())
            gone = {}
            for key, parts in split:  # all parts at once: a concurrent put is kept whole or lost
                tx = self.client.pipeline(transaction=True)
                for p in range(parts):
                    tx.delete(self.name_of(key, p))
                gone[key] = bool(tx.execute()[0])
            out += [gone[k] if k in gone else bool(next(removed)) for k in run]
        return out

    def _stored_parts(self, head) -> int:
        if not head or len(head) < HEADER_SIZE:
            return 1
        try:
            return self._parts(parse_header(head).total_len)
        except BlockError:
            return 1

    # --- listing ----------------------------------------------------------------------
    def _names(self) -> Iterator[str]:
        pattern = f"{_glob_escape(self._tag)}*}}"
        for name in self.client.scan_iter(match=pattern, count=1000):
            yield name.decode() if isinstance(name, bytes) else name

    def iter_keys(self) -> Iterator[bytes]:
        keys = [key_of(n) for n in self._names()]
        return iter([k for k in keys if k is not None])

    def usage(self) -> TierUsage:
        """Blocks and bytes of this namespace on the server (a SCAN: costs one pass over it)."""
        names = list(self._names())
        used = 0
        for run in batches(names, self.options.batch):
            pipe = self._pipe()
            for name in run:
                pipe.getrange(name, 0, HEADER_SIZE - 1)
            for head in pipe.execute():
                try:
                    used += parse_header(head).total_len
                except BlockError:
                    continue
        return TierUsage(used, self._capacity(), len(names), self._notes())

    def _capacity(self) -> int:
        try:
            info = self.client.info("memory")
        except ResponseError:
            return 0
        if isinstance(info, dict) and "maxmemory" not in info:  # a cluster: one dict per node
            return sum(int(v.get("maxmemory", 0)) for v in info.values() if isinstance(v, dict))
        return int(info.get("maxmemory", 0))

    def _notes(self) -> tuple[str, ...]:
        notes = []
        if self.degraded:
            notes.append(f"degraded at open: {self.degraded}")
        if self.refused_puts:
            notes.append(f"{self.refused_puts} puts refused by the server (full?)")
        return tuple(notes)

    def close(self) -> None:
        self._decoders.close()
        client, self._client = self._client, None
        if client is not None:
            client.close()


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _brief(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


__all__ = ["SCHEMES", "RedisTier"]
