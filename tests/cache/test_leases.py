"""Leases pin keys until released or expired; nothing stays pinned forever."""

from __future__ import annotations

import pytest

from kvtier.cache.leases import LeaseTable
from kvtier.errors import ConfigError

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


class Clock:
    """A clock the test moves by hand (the table under test reads it)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock) -> LeaseTable:
    return LeaseTable(max_ttl_s=60.0, clock=clock)


def test_a_lease_pins_its_keys_until_released(table):
    lease = table.acquire([A, B], ttl_s=10)
    assert table.is_pinned(A) and table.is_pinned(B) and not table.is_pinned(C)
    assert lease.active and table.pinned_keys() == 2
    lease.release()
    assert not table.is_pinned(A) and not lease.active and table.pinned_keys() == 0
    lease.release()  # idempotent


def test_a_lease_expires_by_itself(table, clock):
    lease = table.acquire([A], ttl_s=10)
    clock.now += 9.9
    assert table.is_pinned(A)
    clock.now += 0.2
    assert not table.is_pinned(A) and not lease.active
    assert table.pinned_keys() == 0  # and it is forgotten


def test_overlapping_leases_keep_a_key_pinned_until_the_last_ends(table, clock):
    short = table.acquire([A, B], ttl_s=5)
    long = table.acquire([A], ttl_s=30)
    long.release()
    assert table.is_pinned(A)  # the short lease still holds it
    clock.now += 6
    assert not table.is_pinned(A) and not table.is_pinned(B)
    again = table.acquire([A], ttl_s=30)
    short.release()  # releasing an expired lease does not unpin another's key
    assert table.is_pinned(A)
    again.release()


def test_releasing_the_longer_lease_falls_back_to_the_shorter_deadline(table, clock):
    table.acquire([A], ttl_s=5)
    long = table.acquire([A], ttl_s=30)
    long.release()
    clock.now += 6
    assert not table.is_pinned(A)


def test_ttl_is_capped_so_nothing_stays_pinned_forever(table, clock):
    lease = table.acquire([A], ttl_s=1e9)
    assert lease.expires_at == pytest.approx(clock.now + 60)
    clock.now += 61
    assert not table.is_pinned(A)


def test_renew_extends_an_active_lease_only(table, clock):
    lease = table.acquire([A], ttl_s=5)
    clock.now += 4
    lease.renew(5)
    clock.now += 4
    assert table.is_pinned(A)
    clock.now += 2
    with pytest.raises(ConfigError, match="expired"):
        lease.renew(5)


def test_bad_ttls_are_refused(table):
    with pytest.raises(ConfigError):
        table.acquire([A], ttl_s=0)
    lease = table.acquire([A], ttl_s=1)
    with pytest.raises(ConfigError):
        lease.renew(-1)


def test_a_lease_is_a_context_manager(table):
    with table.acquire([A, A, B], ttl_s=5) as lease:
        assert lease.keys == (A, B)
        assert table.is_pinned(A)
    assert not table.is_pinned(A)


def test_expired_leases_are_reaped_on_later_acquires(table, clock):
    for i in range(100):
        table.acquire([bytes([i]) * 16], ttl_s=1)
    clock.now += 2
    table.acquire([C], ttl_s=1)
    assert len(table._leases) == 1 and len(table._holders) == 1
