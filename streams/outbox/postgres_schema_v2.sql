-- The Rhumbatron outbox on PostgreSQL, schema version 2: what it adds to version 1
-- (postgres_schema_v1.sql). `rhumbatron outbox init` applies version 1 and then this file in
-- one transaction; `rhumbatron outbox migrate` applies this file alone to a version 1 outbox,
-- online: it adds tables and functions and replaces the slot trigger's function, and touches no
-- row and no column, so writers and publishers of either version keep working through the move.
--
-- Version 2 checks at INSERT every rule the publisher applies when it reads the row, so a row
-- the publisher would refuse (and hold its project back for) is refused to its writer instead,
-- naming the column, the value and the rule (SQLSTATE 23514, check_violation):
--   - the envelope's fields: names 1..200 characters without control characters, the id, type
--     and version grammar, resource, canonical_generation, a timestamp of the years 0001-9999;
--   - the payload: a JSON object, numbers a double can hold, nested at most 253 levels, and for
--     a cataloged (event_type, event_version) its model's rules (outbox_payload_rules, written
--     from the catalog by init and migrate; a version the catalog does not know passes);
--   - the size: the envelope's size estimated from the row against outbox_limits (written from
--     the settings by init and migrate). The estimate counts the payload as PostgreSQL writes
--     it, a space after every ':' and ',', so it is a little over the canonical size: an event
--     within that margin of max_envelope_bytes is refused here though the publisher would send
--     it (docs/outbox.md).

-- Limits the checks read, from the settings (`outbox init` and `outbox migrate` write them).
CREATE TABLE outbox_limits (
    name text PRIMARY KEY,
    value bigint NOT NULL,
    setting text NOT NULL  -- the setting it comes from (router/settings.py)
);

-- One row per field of a cataloged (event_type, event_version)'s payload model, generated from
-- the catalog (streams/outbox/postgres_checks.py) by `outbox init` and `outbox migrate`.
CREATE TABLE outbox_payload_rules (
    event_type text NOT NULL,
    event_version integer NOT NULL,
    position integer NOT NULL,  -- the model's field order: the first broken rule is named
    field text NOT NULL,  -- the wire name (camelCase)
    alt_field text,  -- the model's own name, which it also reads (snake_case), if different
    required boolean NOT NULL,
    nullable boolean NOT NULL,
    json_type text NOT NULL
        CHECK (json_type IN ('string', 'integer', 'number', 'boolean', 'array', 'object')),
    min_length integer,
    max_length integer,
    non_blank boolean NOT NULL DEFAULT false,  -- at least one character that is not white space
    minimum numeric,
    maximum numeric,
    max_items integer,
    item_type text CHECK (item_type IN ('string', 'integer', 'number', 'boolean', 'object')),
    item_min_length integer,
    item_max_length integer,
    item_non_blank boolean NOT NULL DEFAULT false,
    PRIMARY KEY (event_type, event_version, field)
);

-- Raises check_violation with the message every refusal shares: "outbox: <what> (<rule>)".
CREATE FUNCTION outbox_refuse(message text, hint text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'outbox: %', message USING ERRCODE = 'check_violation', HINT = hint;
END
$$;

-- A Name field of the envelope: 1..200 characters, no control character (U+0001..U+001F).
CREATE FUNCTION outbox_check_name(value text, col text, wire text, required boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    bad text;
BEGIN
    IF value IS NULL THEN
        IF required THEN
            PERFORM outbox_refuse(format('%s is missing (Event.%s)', col, wire),
                                  format('every event names its %s', col));
        END IF;
        RETURN;
    END IF;
    IF value = '' THEN
        PERFORM outbox_refuse(format('%s is empty, under the 1 character required (Event.%s)',
                                     col, wire),
                              format('give %s 1 to 200 characters, or leave it out if optional',
                                     col));
    END IF;
    IF length(value) > 200 THEN
        PERFORM outbox_refuse(format('%s is %s characters, over the 200 allowed (Event.%s)',
                                     col, length(value), wire),
                              format('shorten %s to at most 200 characters', col));
    END IF;
    bad := substring(value FROM '[\x01-\x1f]');
    IF bad IS NOT NULL THEN
        PERFORM outbox_refuse(format('%s %s holds the control character U+%s (Event.%s: no control characters)',
                                     col, left(to_jsonb(value)::text, 60),
                                     lpad(upper(to_hex(ascii(bad))), 4, '0'), wire),
                              format('remove control characters from %s', col));
    END IF;
END
$$;

-- A JSON value against one type and its string rules; `path` names it (payload.agentId).
CREATE FUNCTION outbox_check_value(
    v jsonb, path text, rule text, json_type text, min_length integer, max_length integer,
    non_blank boolean, minimum numeric, maximum numeric
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    kind text := jsonb_typeof(v);
    s text;
    n numeric;
BEGIN
    IF json_type = 'integer' THEN
        IF kind <> 'number' OR v::text !~ '^-?[0-9]+$' THEN
            PERFORM outbox_refuse(format('%s is %s, not a whole number (%s)',
                                         path, left(v::text, 60), rule),
                                  format('write %s as a JSON integer', path));
        END IF;
    ELSIF json_type = 'number' THEN
        IF kind <> 'number' THEN
            PERFORM outbox_refuse(format('%s is %s, not a number (%s)', path, left(v::text, 60), rule),
                                  format('write %s as a JSON number', path));
        END IF;
    ELSIF kind IS DISTINCT FROM json_type THEN
        PERFORM outbox_refuse(format('%s is %s, a JSON %s where %s wants a %s',
                                     path, left(v::text, 60), kind, rule, json_type),
                              format('write %s as a JSON %s', path, json_type));
    END IF;
    IF json_type IN ('integer', 'number') AND (minimum IS NOT NULL OR maximum IS NOT NULL) THEN
        n := v::text::numeric;
        IF n < minimum OR n > maximum THEN
            PERFORM outbox_refuse(format('%s is %s, outside %s..%s (%s)',
                                         path, n, coalesce(minimum::text, ''),
                                         coalesce(maximum::text, ''), rule),
                                  format('give %s a value in range', path));
        END IF;
    END IF;
    IF json_type = 'string' THEN
        s := v #>> '{}';
        IF length(s) < min_length THEN
            PERFORM outbox_refuse(format('%s is %s characters, under the %s required (%s)',
                                         path, length(s), min_length, rule),
                                  format('give %s at least %s characters', path, min_length));
        END IF;
        IF length(s) > max_length THEN
            PERFORM outbox_refuse(format('%s is %s characters, over the %s allowed (%s)',
                                         path, length(s), max_length, rule),
                                  format('shorten %s to at most %s characters', path, max_length));
        END IF;
        -- Unicode's White_Space, the class the catalog's pattern \S excludes.
        IF non_blank AND s !~ '[^\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]' THEN
            PERFORM outbox_refuse(format('%s is %s, only white space (%s: it must say something)',
                                         path, left(v::text, 60), rule),
                                  format('give %s a value that is not blank', path));
        END IF;
    END IF;
END
$$;

-- A cataloged (event_type, event_version)'s payload against its model's rules. A type or a
-- version without rules passes, as the publisher passes it.
CREATE FUNCTION outbox_check_payload(p_type text, p_version integer, payload jsonb)
RETURNS void LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r outbox_payload_rules;
    v jsonb;
    key text;
    item jsonb;
    n integer;
    rule text := format('%s@%s', p_type, p_version);
BEGIN
    FOR r IN SELECT * FROM outbox_payload_rules
             WHERE event_type = p_type AND event_version = p_version ORDER BY position LOOP
        IF payload ? r.field THEN
            key := r.field;
        ELSIF r.alt_field IS NOT NULL AND payload ? r.alt_field THEN
            key := r.alt_field;
        ELSE
            IF r.required THEN
                PERFORM outbox_refuse(format('payload.%s is missing (%s requires it)', r.field, rule),
                                      format('add "%s" to the payload', r.field));
            END IF;
            CONTINUE;
        END IF;
        v := payload -> key;
        IF jsonb_typeof(v) = 'null' THEN
            IF NOT r.nullable THEN
                PERFORM outbox_refuse(format('payload.%s is null (%s wants a %s)', key, rule, r.json_type),
                                      format('give payload.%s a value, or leave it out if optional', key));
            END IF;
            CONTINUE;
        END IF;
        PERFORM outbox_check_value(v, 'payload.' || key, rule, r.json_type, r.min_length,
                                   r.max_length, r.non_blank, r.minimum, r.maximum);
        IF r.json_type = 'array' THEN
            IF r.max_items IS NOT NULL AND jsonb_array_length(v) > r.max_items THEN
                PERFORM outbox_refuse(format('payload.%s holds %s items, over the %s allowed (%s)',
                                             key, jsonb_array_length(v), r.max_items, rule),
                                      format('send at most %s items in payload.%s', r.max_items, key));
            END IF;
            IF r.item_type IS NOT NULL THEN
                n := 0;
                FOR item IN SELECT value FROM jsonb_array_elements(v) LOOP
                    PERFORM outbox_check_value(item, format('payload.%s.%s', key, n), rule,
                                               r.item_type, r.item_min_length, r.item_max_length,
                                               r.item_non_blank, NULL, NULL);
                    n := n + 1;
                END LOOP;
            END IF;
        END IF;
    END LOOP;
END
$$;

-- How deep containers nest in a JSON value (a scalar: 0).
CREATE FUNCTION outbox_json_depth(v jsonb) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    WITH RECURSIVE walk(item, depth) AS (
        SELECT v, 1 WHERE jsonb_typeof(v) IN ('object', 'array')
        UNION ALL
        SELECT child.value, walk.depth + 1 FROM walk,
            LATERAL (SELECT value FROM jsonb_each(walk.item) WHERE jsonb_typeof(walk.item) = 'object'
                     UNION ALL
                     SELECT value FROM jsonb_array_elements(walk.item)
                     WHERE jsonb_typeof(walk.item) = 'array') child
        WHERE jsonb_typeof(child.value) IN ('object', 'array')
    )
    SELECT coalesce(max(depth), 0) FROM walk
$$;

-- Every rule of a row but its size (which needs the slot): the publisher's, so a row it would
-- refuse is refused here.
CREATE FUNCTION outbox_check_row(o outbox) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    year numeric;
    text_form text;
BEGIN
    IF o.event_id IS NULL OR o.event_id !~ '^evt_[0-9a-f]{32}$' THEN
        PERFORM outbox_refuse(format('event_id %s is not evt_ and 32 lowercase hex digits (Event.eventId)',
                                     coalesce(left(to_jsonb(o.event_id)::text, 60), 'is missing;')),
                              'make ids as evt_ || md5(...) or evt_ || replace(gen_random_uuid()::text, ''-'', '''')');
    END IF;
    IF o.event_type IS NULL OR length(o.event_type) > 100
       OR o.event_type !~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$' THEN
        PERFORM outbox_refuse(format('event_type %s is not dotted lowercase words of at most 100 characters, like task.completed (Event.eventType)',
                                     coalesce(left(to_jsonb(o.event_type)::text, 60), 'is missing;')),
                              'use the catalog''s name for the event type (docs/events.md)');
    END IF;
    IF o.event_version IS NULL OR o.event_version < 1 THEN
        PERFORM outbox_refuse(format('event_version is %s, not a version from 1 up (Event.eventVersion)',
                                     coalesce(o.event_version::text, 'missing')),
                              'leave event_version out (1) or give the payload''s version');
    END IF;
    PERFORM outbox_check_name(o.tenant_id, 'tenant_id', 'tenantId', true);
    PERFORM outbox_check_name(o.project_id, 'project_id', 'projectId', true);
    PERFORM outbox_check_name(o.change_id, 'change_id', 'changeId', false);
    PERFORM outbox_check_name(o.task_id, 'task_id', 'taskId', false);
    PERFORM outbox_check_name(o.actor, 'actor', 'actor', true);
    PERFORM outbox_check_name(o.caused_by, 'caused_by', 'causedBy', false);
    PERFORM outbox_check_name(o.correlation_id, 'correlation_id', 'correlationId', false);
    IF length(o.resource) > 1000 THEN
        PERFORM outbox_refuse(format('resource is %s characters, over the 1000 allowed (Event.resource)',
                                     length(o.resource)),
                              'shorten resource to at most 1000 characters');
    END IF;
    IF o.canonical_generation < 0 THEN
        PERFORM outbox_refuse(format('canonical_generation is %s, under 0 (Event.canonicalGeneration)',
                                     o.canonical_generation),
                              'give a generation from 0 up, or leave it out');
    END IF;
    IF o.occurred_at IS NULL THEN
        PERFORM outbox_refuse('occurred_at is missing (Event.timestamp)',
                              'leave occurred_at out (now()) or give the time of the event');
    END IF;
    year := CASE WHEN isfinite(o.occurred_at)
                 THEN extract(year FROM o.occurred_at AT TIME ZONE 'UTC') END;
    IF year IS NULL OR year NOT BETWEEN 1 AND 9999 THEN
        PERFORM outbox_refuse(format('occurred_at is %s, outside the years 0001-9999 (UTC) an envelope''s timestamp can write (Event.timestamp)',
                                     o.occurred_at),
                              'give the time of the event, in the years 0001-9999');
    END IF;
    IF o.payload IS NULL OR jsonb_typeof(o.payload) <> 'object' THEN
        PERFORM outbox_refuse(format('payload is %s, not a JSON object (Event.payload)',
                                     coalesce(left(o.payload::text, 60), 'missing')),
                              'write the payload as a JSON object: {} when there is nothing to say');
    END IF;
    IF jsonb_path_exists(o.payload, 'strict $.** ? (@.type() == "number" && (@ >= 1.7976931348623158e308 || @ <= -1.7976931348623158e308))') THEN
        PERFORM outbox_refuse('payload holds a number beyond a double''s range (about 1.8e308), which no reader can parse (Event.payload)',
                              'send such numbers as strings');
    END IF;
    text_form := o.payload::text;
    -- Counting brackets is cheap and no fewer can nest that deep; the walk is exact.
    IF length(text_form) - length(translate(text_form, '[{', '')) > 253
       AND outbox_json_depth(o.payload) > 253 THEN
        PERFORM outbox_refuse(format('payload nests %s levels deep, over the 253 an envelope''s payload may (Event.payload)',
                                     outbox_json_depth(o.payload)),
                              'flatten the payload');
    END IF;
    PERFORM outbox_check_payload(o.event_type, o.event_version, o.payload);
END
$$;

-- The envelope's size, estimated: its JSON text as PostgreSQL writes it, less the space after
-- each of its own keys' ':' and ','. The payload's own spaces stay in: the margin.
CREATE FUNCTION outbox_envelope_size(o outbox) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT octet_length(e::text) - (2 * (SELECT count(*) FROM jsonb_object_keys(e)) - 1)
    FROM (SELECT outbox_envelope(o) AS e) envelope
$$;

CREATE FUNCTION outbox_check_size(o outbox) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    max_bytes bigint := (SELECT value FROM outbox_limits WHERE name = 'max_envelope_bytes');
    size bigint;
BEGIN
    IF max_bytes IS NULL THEN
        RETURN;
    END IF;
    size := outbox_envelope_size(o);
    IF size > max_bytes THEN
        PERFORM outbox_refuse(format('event %s is about %s bytes as an envelope, over the %s allowed (max_envelope_bytes)',
                                     o.event_id, size, max_bytes),
                              'make the payload smaller: put large content elsewhere and name it');
    END IF;
END
$$;

-- The row's envelope, as in version 1 but for a timestamp outside the years 0001-9999: to_char
-- writes 1 BC as 0001, so such a time is written with its era, a form no reader accepts.
CREATE OR REPLACE FUNCTION outbox_envelope(o outbox) RETURNS jsonb
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
        'timestamp', to_char(o.occurred_at AT TIME ZONE 'UTC',
                             CASE WHEN o.occurred_at AT TIME ZONE 'UTC' < '0001-01-01'
                                  THEN 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z" BC'
                                  ELSE 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"' END),
        'slot', o.slot
    )) || jsonb_build_object('payload', o.payload)
$$;

-- The slot trigger of version 1, with the checks: the row's rules before anything is locked or
-- counted (bad input is refused even when its id is a duplicate), its size once it has a slot.
CREATE OR REPLACE FUNCTION outbox_assign_slot() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    next_slot bigint;
BEGIN
    IF NEW.slot IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: event % names slot %, but only the outbox assigns slots',
            NEW.event_id, NEW.slot
            USING ERRCODE = 'check_violation', HINT = 'leave the slot column out of the INSERT';
    END IF;
    PERFORM outbox_check_row(NEW);
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
    -- A refusal here undoes the counter's bump with the statement.
    PERFORM outbox_check_size(NEW);
    RETURN NEW;
END
$$;

INSERT INTO outbox_schema_version (version) VALUES (2);
