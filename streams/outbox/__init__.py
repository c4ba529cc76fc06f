"""The transactional outbox and its order-keeping publisher (docs/outbox.md).

- :mod:`~streams.outbox.store`: the storage contract (rows, states, the writer's unit of work).
- :mod:`~streams.outbox.sqlite`: the embedded SQLite backend.
- :mod:`~streams.outbox.postgres` (with ``postgres_writer`` and the versioned
  ``postgres_schema_v*.sql``): the PostgreSQL backend, and ``append(conn, drafts)`` for a
  writer's own psycopg transaction.
- :mod:`~streams.outbox.slots`: dense per-project slots, bump-and-report and strict appends.
- :mod:`~streams.outbox.identity`: the outbox's identity, which every published record names
  (header ``outbox``), and :func:`~streams.outbox.identity.outbox_position` to read it back.
- :mod:`~streams.outbox.states`: the publisher policy and the row state machine.
- :mod:`~streams.outbox.sender` and :mod:`~streams.outbox.dispatch`: the producer boundary and
  the two ordering strategies.
- :mod:`~streams.outbox.publisher`: the publisher loop.
- :mod:`~streams.outbox.ops`: operator commands (stats, retry, skip, purge).
"""
