"""Producer leases: each process of a subscription with Kafka effects (and each command worker)
leases the lowest free lease number in Redis and uses it in its transactional id
(``rhumbatron-<slug>-<env>-<n>``). A process restarted under the same lease number fences its own
zombie's transactions; a lease that is not renewed expires, so a crashed process gives its number
back. The Redis keys are ``rh:<env>:{slots}:<slug>:<n>`` (the ``{slots}`` hash tag is the name
the keys had before the concept was called a producer lease; it stays so running leases survive
an upgrade)."""

from __future__ import annotations

import time
import uuid

import redis

from streams.errors import ProducerLeaseLost, RhumbatronError

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class ProducerLease:
    """One process's lease on a transactional-id number of ``slug``."""

    def __init__(
        self, client: redis.Redis[bytes], *, env: str, slug: str, ttl_s: int, max_leases: int = 1024
    ) -> None:
        self.client = client
        self.prefix = f"rh:{env}:{{slots}}:{slug}:"
        self.ttl_s = ttl_s
        self.max_leases = max_leases
        self.holder = uuid.uuid4().hex
        self.number: int | None = None
        self._renewed = 0.0
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def acquire(self) -> int:
        for n in range(self.max_leases):
            if self.client.set(self.prefix + str(n), self.holder, nx=True, ex=self.ttl_s):
                self.number = n
                return n
        raise RhumbatronError(
            f"all {self.max_leases} producer leases of {self.prefix} are held; stop a process of "
            "this subscription or wait for a crashed one's lease to expire"
        )

    def renew(self) -> None:
        """Called from the loop; talks to Redis at most three times per lease period."""
        if self.number is None or time.monotonic() - self._renewed < self.ttl_s / 3:
            return
        self._renewed = time.monotonic()
        if not self._renew(
            keys=[self.prefix + str(self.number)], args=[self.holder, str(self.ttl_s)]
        ):
            raise ProducerLeaseLost(
                f"producer lease {self.number} of {self.prefix} was lost (this process stalled "
                f"past {self.ttl_s}s); stopping"
            )

    def release(self) -> None:
        if self.number is not None:
            self._release(keys=[self.prefix + str(self.number)], args=[self.holder])
            self.number = None
