"""The chaos matrix (issue 17): scenarios run against real Kafka, Redis and real processes, each
injecting one fault into a live pipeline (outbox → publisher → subscriptions), letting it heal
and drain, then checking the invariants from records the subscriptions' own dedupe does not shape.

- :mod:`.scenarios`: the declarative rows (``Scenario``: fault, when, workload, services);
- :mod:`.pipeline`: the supervised processes (publisher, one process per subscription);
- :mod:`.faults`: how each kind of fault is injected and healed;
- :mod:`.publisher_faults`: the publisher's drills (a project the broker refuses, a second
  publisher);
- :mod:`.outboxes` and :mod:`.writers`: the row's outbox (SQLite or PostgreSQL) and the writers
  that commit the workload through it, retrying what a lost database failed;
- :mod:`.invariants`: I1 to I5, each a list of what is wrong (empty: holds);
- :mod:`.outbox_checks`: the outbox's slots and the streams' order, filed under I1 to I5;
- :mod:`.runner`: one row, end to end;
- ``python -m tests.chaos.matrix [NAME ...]`` (``make chaos``): every row (or the named ones),
  one line each, ``chaos: N/M rows passed``, the matrix as JSON in ``.local/chaos.json``.

Fault injection lives with the tests: it is not a product command.
"""
