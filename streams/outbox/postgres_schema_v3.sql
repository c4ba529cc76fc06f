-- The Rhumbatron outbox on PostgreSQL, schema version 3: what it adds to version 2
-- (postgres_schema_v2.sql). `rhumbatron outbox init` applies versions 1, 2 and then this file in
-- one transaction; `rhumbatron outbox migrate` applies this file alone to a version 2 outbox (2 and
-- then 3 to a version 1 one), online: it adds one table and its one row, and touches no other
-- table, row or function, so writers and publishers of an older version keep working through the
-- move and after it.
--
-- The outbox's identity: slots are numbered per outbox, so the publisher names on every event the
-- outbox whose numbering its slot belongs to (the `outbox` record header). The id is made here,
-- once, and lives in this database: the same outbox reached under another address, or restored
-- from a backup, keeps it. `obx_` and 16 lowercase hex characters (64 bits of a random UUID's
-- digest; gen_random_uuid() is built in from PostgreSQL 13).

CREATE TABLE outbox_identity (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),  -- a single row
    outbox_id text NOT NULL CHECK (outbox_id ~ '^obx_[0-9a-f]{16}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_identity (outbox_id)
VALUES ('obx_' || substr(md5(gen_random_uuid()::text), 1, 16));

INSERT INTO outbox_schema_version (version) VALUES (3);
