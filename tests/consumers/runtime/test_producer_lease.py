"""Producer leases against real Redis: the lowest free number, its key, renewal and release."""

from __future__ import annotations

import secrets

import pytest

from consumers.redis_conn import connect
from consumers.runtime.producer_lease import ProducerLease
from streams.errors import ProducerLeaseLost, RhumbatronError
from tests.support.environment import TEST_REDIS

pytestmark = pytest.mark.integration


def test_two_processes_lease_the_lowest_free_numbers_and_give_them_back() -> None:
    client = connect(TEST_REDIS, timeout=5)
    env = "t" + secrets.token_hex(5)
    first = ProducerLease(client, env=env, slug="router", ttl_s=30)
    second = ProducerLease(client, env=env, slug="router", ttl_s=30)
    try:
        assert (first.acquire(), second.acquire()) == (0, 1)
        # The key names are what running processes hold: they must not change.
        assert client.get(f"rh:{env}:{{slots}}:router:0") == first.holder.encode()
        assert client.get(f"rh:{env}:{{slots}}:router:1") == second.holder.encode()
        first.release()
        assert client.get(f"rh:{env}:{{slots}}:router:0") is None
        third = ProducerLease(client, env=env, slug="router", ttl_s=30)
        assert third.acquire() == 0
        third.release()
    finally:
        first.release()
        second.release()


def test_a_lease_taken_over_is_lost_on_renewal_and_all_numbers_held_is_an_error() -> None:
    client = connect(TEST_REDIS, timeout=5)
    env = "t" + secrets.token_hex(5)
    lease = ProducerLease(client, env=env, slug="w", ttl_s=30, max_leases=1)
    try:
        assert lease.acquire() == 0
        with pytest.raises(RhumbatronError, match="all 1 producer leases"):
            ProducerLease(client, env=env, slug="w", ttl_s=30, max_leases=1).acquire()
        client.set(f"rh:{env}:{{slots}}:w:0", b"someone else")
        with pytest.raises(ProducerLeaseLost, match="producer lease 0"):
            lease.renew()
    finally:
        client.delete(f"rh:{env}:{{slots}}:w:0")
