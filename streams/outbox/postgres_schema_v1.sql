-- The Rhumbatron outbox on PostgreSQL, schema version 1 (docs/outbox.md, "The PostgreSQL
-- outbox"). Applied by `rhumbatron outbox init --outbox URL` in one transaction, into the first
-- schema of the URL's search_path (public by default). Every function pins that schema as its
-- search_path, so a writer whose own search_path differs still reaches these tables.
--
-- A writer in any language appends an event with one INSERT in its own transaction:
--
--   INSERT INTO outbox (event_id, event_type, project_id, tenant_id, actor, payload)
--   VALUES ('evt_…32 hex…', 'task.completed', 'proj-1', 'tenant-1', 'service:billing', '{…}')
--   ON CONFLICT (event_id) DO NOTHING
--   RETURNING slot;
--
-- The trigger gives the row the project's next slot under the project's counter row lock, held
-- until the writer commits: slots are dense (no hole, no duplicate) under concurrent writers. A
-- repeated event_id is ignored, uses no slot and returns no row, with or without ON CONFLICT.
-- rhumbatron_append(...) adds what one INSERT cannot say: the slot the writer has seen, the
-- events it missed (bump-and-report), or a refusal (strict).

CREATE TABLE outbox_schema_version (
    version integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO outbox_schema_version (version) VALUES (1);

-- One counter per project: the last slot given out. Never reset (purging rows leaves it).
CREATE TABLE outbox_slots (
    project_id text PRIMARY KEY,
    last_slot bigint NOT NULL CHECK (last_slot >= 0)
);

CREATE TABLE outbox (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- what the writer supplies (the event's fields; names as in the wire envelope, snake_case)
    event_id text NOT NULL UNIQUE CHECK (event_id ~ '^evt_[0-9a-f]{32}$'),
    event_type text NOT NULL
        CHECK (event_type ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$' AND length(event_type) <= 100),
    event_version integer NOT NULL DEFAULT 1 CHECK (event_version >= 1),
    tenant_id text NOT NULL CHECK (tenant_id <> '' AND length(tenant_id) <= 200),
    project_id text NOT NULL CHECK (project_id <> '' AND length(project_id) <= 200),
    change_id text,
    task_id text,
    actor text NOT NULL CHECK (actor <> '' AND length(actor) <= 200),
    resource text,
    canonical_generation integer CHECK (canonical_generation >= 0),
    caused_by text,
    correlation_id text,
    payload jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(payload) = 'object'),
    occurred_at timestamptz NOT NULL DEFAULT now(),  -- the envelope's timestamp
    trace_context jsonb,  -- the writer's W3C trace context: {"traceparent": "…", "tracestate": "…"}
    created_at timestamptz NOT NULL DEFAULT now(),
    -- what the outbox sets: the slot (trigger), and the publisher's bookkeeping
    slot bigint NOT NULL,
    state text NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'published', 'retry_wait', 'failed', 'skipped')),
    attempts integer NOT NULL DEFAULT 0,
    deferrals integer NOT NULL DEFAULT 0,
    next_attempt_at double precision,  -- seconds since the epoch
    last_error text,
    published_at double precision,  -- seconds since the epoch
    UNIQUE (project_id, slot)
);
CREATE INDEX outbox_open ON outbox (project_id, slot)
    WHERE state IN ('pending', 'retry_wait', 'failed');
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE state = 'retry_wait';
CREATE INDEX outbox_published ON outbox (published_at) WHERE state = 'published';

CREATE TABLE outbox_audit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at double precision NOT NULL,
    who text NOT NULL,
    action text NOT NULL,
    event_id text NOT NULL,
    project_id text NOT NULL,
    slot bigint NOT NULL,
    from_state text NOT NULL,
    reason text,
    last_error text
);

-- The slot, under the project's counter row lock. The duplicate check comes first: a trigger
-- that bumped the counter and then let ON CONFLICT (event_id) DO NOTHING drop the row would
-- leave a hole for ever. Two transactions inserting the same event_id (even for two projects)
-- queue on a transaction lock keyed by the id, so the second sees the first's row once that
-- commits, and nothing of it if that rolls back.
CREATE FUNCTION outbox_assign_slot() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    next_slot bigint;
BEGIN
    IF NEW.slot IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: event % names slot %, but only the outbox assigns slots',
            NEW.event_id, NEW.slot
            USING ERRCODE = 'check_violation', HINT = 'leave the slot column out of the INSERT';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(NEW.event_id, 0));
    IF EXISTS (SELECT 1 FROM outbox WHERE event_id = NEW.event_id) THEN
        RETURN NULL;  -- a duplicate: ignored, no slot used
    END IF;
    INSERT INTO outbox_slots AS s (project_id, last_slot) VALUES (NEW.project_id, 1)
        ON CONFLICT (project_id) DO UPDATE SET last_slot = s.last_slot + 1
        RETURNING s.last_slot INTO next_slot;
    NEW.slot := next_slot;
    NEW.state := 'pending';
    NEW.attempts := 0;
    NEW.deferrals := 0;
    NEW.next_attempt_at := NULL;
    NEW.last_error := NULL;
    NEW.published_at := NULL;
    RETURN NEW;
END
$$;
CREATE TRIGGER outbox_assign_slot BEFORE INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_assign_slot();

-- Wakes the publisher when the writer commits (NOTIFY is delivered at commit, once per
-- transaction). The payload names the schema, so outboxes in several schemas of one database
-- wake only their own publisher.
CREATE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM pg_notify('rhumbatron_outbox', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- A row as its wire envelope (camelCase keys, absent fields left out, the timestamp in
-- milliseconds UTC), as the publisher sends it and rhumbatron_append reports it. It reads only
-- its argument, so it needs no search_path of its own, and PostgreSQL can inline it.
CREATE FUNCTION outbox_envelope(o outbox) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'eventId', o.event_id,
        'eventType', o.event_type,
        'eventVersion', o.event_version,
        'tenantId', o.tenant_id,
        'projectId', o.project_id,
        'changeId', o.change_id,
        'taskId', o.task_id,
        'actor', o.actor,
        'resource', o.resource,
        'canonicalGeneration', o.canonical_generation,
        'causedBy', o.caused_by,
        'correlationId', o.correlation_id,
        'timestamp', to_char(o.occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'slot', o.slot
    )) || jsonb_build_object('payload', o.payload)
$$;

-- One project's events in one call, with the full slot contract:
--   p_events     a JSON array of events, keys as in the wire envelope (eventId, eventType,
--                actor, payload, changeId, taskId, resource, canonicalGeneration, causedBy,
--                correlationId, eventVersion, timestamp); projectId, if given, must match
--   p_seen_slot  the highest slot the writer has seen (NULL: it does not say)
--   p_strict     refuse (SQLSTATE RH409, nothing written) when the project moved past p_seen_slot
-- Returns {"projectId", "slots", "eventIds", "duplicates", "head", "missed", "missedComplete"}:
-- the new events' slots and ids in order, the ids ignored as duplicates, the project's last slot
-- after the append, and the events on slots p_seen_slot+1 .. (first new slot - 1) as envelopes
-- (at most p_missed_limit; missedComplete says whether the list is whole). A strict refusal's
-- DETAIL is the same object with "seenSlot" (and no slots).
CREATE FUNCTION rhumbatron_append(
    p_project_id text,
    p_tenant_id text,
    p_events jsonb,
    p_seen_slot bigint DEFAULT NULL,
    p_strict boolean DEFAULT false,
    p_trace_context jsonb DEFAULT NULL,
    p_missed_limit integer DEFAULT 1000,
    p_now timestamptz DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    head bigint;
    first_missed bigint;
    missed jsonb;
    missed_count bigint;
    complete boolean;
    item jsonb;
    new_slot bigint;
    slots jsonb := '[]';
    ids jsonb := '[]';
    duplicates jsonb := '[]';
    stamp timestamptz := coalesce(p_now, now());
BEGIN
    IF jsonb_typeof(p_events) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'rhumbatron_append: p_events must be a JSON array of events'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_strict AND p_seen_slot IS NULL THEN
        RAISE EXCEPTION 'strict append to project ''%'' needs p_seen_slot (the highest slot the writer has seen; 0 if none)',
            p_project_id USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Lock the project's counter row (made at 0 when new) until the writer commits.
    INSERT INTO outbox_slots AS s (project_id, last_slot) VALUES (p_project_id, 0)
        ON CONFLICT (project_id) DO UPDATE SET last_slot = s.last_slot
        RETURNING s.last_slot INTO head;
    IF p_seen_slot IS NOT NULL AND (p_seen_slot < 0 OR p_seen_slot > head) THEN
        RAISE EXCEPTION 'seen_slot % for project ''%'' is outside 0..% (the project''s last slot is %): pass the highest slot the writer actually read',
            p_seen_slot, p_project_id, head, head USING ERRCODE = 'invalid_parameter_value';
    END IF;
    first_missed := coalesce(p_seen_slot, head) + 1;
    SELECT coalesce(jsonb_agg(outbox_envelope(m) ORDER BY m.slot), '[]'), count(*)
        INTO missed, missed_count
        FROM (SELECT * FROM outbox o WHERE o.project_id = p_project_id
              AND o.slot BETWEEN first_missed AND head ORDER BY o.slot LIMIT p_missed_limit) m;
    complete := missed_count = greatest(head - first_missed + 1, 0);
    IF p_strict AND head > p_seen_slot THEN
        RAISE EXCEPTION 'strict append to project ''%'' refused: the writer saw up to slot % but the project is at slot %',
            p_project_id, p_seen_slot, head
            USING ERRCODE = 'RH409', DETAIL = jsonb_build_object(
                'projectId', p_project_id, 'seenSlot', p_seen_slot, 'head', head,
                'missed', missed, 'missedComplete', complete)::text;
    END IF;
    FOR item IN SELECT value FROM jsonb_array_elements(p_events) LOOP
        IF item ? 'projectId' AND item->>'projectId' IS DISTINCT FROM p_project_id THEN
            RAISE EXCEPTION 'event % belongs to project ''%'' but was appended to project ''%'': append each project''s events in their own call',
                item->>'eventId', item->>'projectId', p_project_id
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        new_slot := NULL;
        INSERT INTO outbox (event_id, event_type, event_version, tenant_id, project_id, change_id,
                            task_id, actor, resource, canonical_generation, caused_by,
                            correlation_id, payload, occurred_at, trace_context, created_at)
        VALUES (item->>'eventId', item->>'eventType', coalesce((item->>'eventVersion')::integer, 1),
                p_tenant_id, p_project_id, item->>'changeId', item->>'taskId', item->>'actor',
                item->>'resource', (item->>'canonicalGeneration')::integer, item->>'causedBy',
                item->>'correlationId', coalesce(item->'payload', '{}'),
                coalesce((item->>'timestamp')::timestamptz, stamp), p_trace_context, stamp)
        ON CONFLICT (event_id) DO NOTHING
        RETURNING slot INTO new_slot;
        IF new_slot IS NULL THEN
            duplicates := duplicates || to_jsonb(item->>'eventId');
        ELSE
            slots := slots || to_jsonb(new_slot);
            ids := ids || to_jsonb(item->>'eventId');
            head := new_slot;
        END IF;
    END LOOP;
    RETURN jsonb_build_object(
        'projectId', p_project_id, 'slots', slots, 'eventIds', ids, 'duplicates', duplicates,
        'head', head, 'missed', missed, 'missedComplete', complete
    );
END
$$;
