"""Run one subscription process with a test processor: ``python -m tests.support.subscription_main NAME
[--until-idle S]``. Settings come from the environment like the real CLI's.

- ``ledger``: the built-in ledger;
- ``flaky-ledger``: the ledger, failing on drill events only while RHUMBATRON_TEST_DRILL_FAILS=1
  (so a dead letter's retry can succeed once the cause is gone);
- ``kafka-counter``: Kafka effects: per event one record on ``out_<env>``, a per-project fold.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import ClassVar

import orjson

from consumers.runtime.types import (
    JSON,
    BaseProcessor,
    Delivery,
    EffectKind,
    Effects,
    OutRecord,
    Processor,
)
from consumers.subscriptions.ledger import Ledger
from router.cli.common import stop_on_signals
from router.settings import Settings
from router.wiring.subscription import open_subscription
from streams.admin import admin_client, provision
from streams.envelopes import Event


class FlakyLedger(Ledger):
    slug: ClassVar[str] = "flaky-ledger"

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        if (
            event.payload.get("drill") == "fail"
            and os.environ.get("RHUMBATRON_TEST_DRILL_FAILS") != "1"
        ):
            event = event.model_copy(update={"payload": {}})
        return super().process(event, state, delivery)


class KafkaCounter(BaseProcessor):
    slug: ClassVar[str] = "kafka-counter"
    reducer_version: ClassVar[str] = "1"
    effect_kind: ClassVar[EffectKind] = EffectKind.KAFKA

    def __init__(self, env: str) -> None:
        self.topic = f"out_{env}"

    def reduce(self, state: JSON | None, event: Event) -> JSON | None:
        s = dict(state or {"count": 0})
        s["count"] += 1
        return s

    def process(self, event: Event, state: JSON | None, delivery: Delivery) -> Effects:
        assert state is not None
        body = {
            "project": event.project_id,
            "slot": event.slot,
            "event": event.event_id,
            "count": state["count"],
        }
        rid = delivery.idempotency_key(event.event_id)
        return Effects(records=[OutRecord(self.topic, event.project_id, orjson.dumps(body), rid)])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=["ledger", "flaky-ledger", "kafka-counter"])
    parser.add_argument("--until-idle", type=float)
    args = parser.parse_args()
    settings = Settings()
    processor: Processor = {"ledger": Ledger, "flaky-ledger": FlakyLedger}.get(args.name, Ledger)()
    if args.name == "kafka-counter":
        processor = KafkaCounter(settings.env)
    stop = stop_on_signals()
    # A test processor's redelivery topic: `rhumbatron provision` makes those of the real
    # subscriptions only, and the runtime creates none.
    base = settings.kafka_config()
    provision(
        admin_client(base),
        base,
        [settings.topology.redelivery_spec(processor.slug)],
        topology=settings.topology,
        timeout=settings.connect_timeout_s,
    )
    subscription = open_subscription(settings, processor.slug, processor=processor)
    print("ready", file=sys.stderr, flush=True)  # subscribed: a test may now stop it
    try:
        stats = subscription.runner.run(
            until_idle_s=args.until_idle, should_stop=stop.is_set, tick=subscription.tick
        )
    finally:
        subscription.close()
    print(orjson.dumps(stats.__dict__).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
