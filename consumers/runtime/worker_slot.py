"""Worker slots: each process of a subscription with Kafka effects leases the lowest free slot
number in Redis and uses it in its transactional id (``rhumbatron-<slug>-<env>-<slot>``). A worker
restarted into the same slot fences its own zombie's transactions; a lease that is not renewed
expires, so a crashed process gives its slot back."""

from __future__ import annotations

import time
import uuid

import redis

from streams.errors import RhumbatronError

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


class SlotLost(RhumbatronError):
    pass


class WorkerSlot:
    def __init__(
        self, client: redis.Redis[bytes], *, env: str, slug: str, ttl_s: int, max_slots: int = 1024
    ) -> None:
        self.client = client
        self.prefix = f"rh:{env}:{{slots}}:{slug}:"
        self.ttl_s = ttl_s
        self.max_slots = max_slots
        self.holder = uuid.uuid4().hex
        self.slot: int | None = None
        self._renewed = 0.0
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def acquire(self) -> int:
        for n in range(self.max_slots):
            if self.client.set(self.prefix + str(n), self.holder, nx=True, ex=self.ttl_s):
                self.slot = n
                return n
        raise RhumbatronError(f"all {self.max_slots} worker slots of {self.prefix} are leased")

    def renew(self) -> None:
        """Called from the loop; talks to Redis at most three times per lease period."""
        if self.slot is None or time.monotonic() - self._renewed < self.ttl_s / 3:
            return
        self._renewed = time.monotonic()
        if not self._renew(
            keys=[self.prefix + str(self.slot)], args=[self.holder, str(self.ttl_s)]
        ):
            raise SlotLost(
                f"worker slot {self.slot} lease was lost (this process stalled past {self.ttl_s}s); stopping"
            )

    def release(self) -> None:
        if self.slot is not None:
            self._release(keys=[self.prefix + str(self.slot)], args=[self.holder])
            self.slot = None
