// Writing events through Rhumbatron's PostgreSQL outbox, in the service's own transaction
// (the SQL contract: streams/outbox/postgres_schema_v1.sql of the Rhumbatron repository, and
// docs/outbox.md). Two ways, both inside a transaction the caller opened and commits:
//
// - appendEvents: one call of rhumbatron_append(...) for a project's events. It returns the new
//   events' slots, the ids it ignored as duplicates, the project's last slot, and the events on
//   slots the writer had not seen (those after `seenSlot`), or with `strict` refuses to write.
// - insertEvent: the plain INSERT, one event a statement; it returns the slot, or null when the
//   event id was written before (the outbox ignores the repeat and uses no slot).
//
// The outbox assigns every slot: an INSERT never names one.
import type pg from "pg";

import type { WireEvent } from "./events.js";

export interface AppendResult {
  projectId: string;
  slots: number[];
  eventIds: string[];
  duplicates: string[];
  head: number;
  missed: WireEvent[];
  missedComplete: boolean;
}

export interface AppendOptions {
  /** The highest slot of the project the writer has seen; null: it does not say. */
  seenSlot?: number | null;
  /** Refuse (nothing written) when the project moved past seenSlot. */
  strict?: boolean;
  /** How many missed events to report at most. */
  missedLimit?: number;
}

/** What the database said when it refused a write: its SQLSTATE and its own words. */
export class DatabaseRefusal extends Error {
  constructor(
    readonly sqlstate: string,
    readonly databaseMessage: string,
    readonly detail: string | undefined,
    readonly hint: string | undefined,
  ) {
    super(`refused by the database (SQLSTATE ${sqlstate}): ${databaseMessage}`);
    this.name = "DatabaseRefusal";
  }
}

// The envelope fields rhumbatron_append takes from its own arguments, not from each event.
const OWN_FIELDS = new Set(["tenantId", "projectId", "slot"]);

export async function appendEvents(
  client: pg.ClientBase,
  projectId: string,
  tenantId: string,
  events: WireEvent[],
  options: AppendOptions = {},
): Promise<AppendResult> {
  const items = events.map((event) =>
    Object.fromEntries(Object.entries(event).filter(([name]) => !OWN_FIELDS.has(name))),
  );
  const now = events[0]?.timestamp ?? new Date().toISOString();
  const found = await refusing(() =>
    client.query<{ result: AppendResult }>(
      "SELECT rhumbatron_append($1, $2, $3::jsonb, $4, $5, NULL, $6, $7) AS result",
      [
        projectId,
        tenantId,
        JSON.stringify(items), // a JSON array, not the PostgreSQL array pg makes of a JS one
        options.seenSlot ?? null,
        options.strict ?? false,
        options.missedLimit ?? 1000,
        now,
      ],
    ),
  );
  // jsonb comes back parsed: numbers are numbers already (slots fit in a double).
  return found.rows[0].result;
}

export async function insertEvent(client: pg.ClientBase, event: WireEvent): Promise<number | null> {
  const found = await refusing(() =>
    client.query<{ slot: string }>(
      `INSERT INTO outbox (event_id, event_type, event_version, tenant_id, project_id, change_id,
                           task_id, actor, resource, canonical_generation, caused_by,
                           correlation_id, payload, occurred_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13::jsonb, $14)
       ON CONFLICT (event_id) DO NOTHING
       RETURNING slot`,
      [
        event.eventId,
        event.eventType,
        event.eventVersion,
        event.tenantId,
        event.projectId,
        event.changeId ?? null,
        event.taskId ?? null,
        event.actor,
        event.resource ?? null,
        event.canonicalGeneration ?? null,
        event.causedBy ?? null,
        event.correlationId ?? null,
        JSON.stringify(event.payload),
        event.timestamp,
      ],
    ),
  );
  // bigint arrives as text (a JS number cannot hold every bigint); slots fit in one.
  return found.rows.length === 0 ? null : Number(found.rows[0].slot);
}

/** insertEvent for each of a project's events, in order, reported as appendEvents reports
 * (with no missed events: a plain INSERT does not say what the writer had not seen). */
export async function insertEach(
  client: pg.ClientBase,
  projectId: string,
  events: WireEvent[],
): Promise<AppendResult> {
  const result: AppendResult = {
    projectId,
    slots: [],
    eventIds: [],
    duplicates: [],
    head: 0,
    missed: [],
    missedComplete: true,
  };
  for (const event of events) {
    const slot = await insertEvent(client, event);
    if (slot === null) {
      result.duplicates.push(event.eventId);
    } else {
      result.slots.push(slot);
      result.eventIds.push(event.eventId);
    }
  }
  // The project's counter: after an INSERT that took a slot this transaction holds its lock,
  // so no other writer can have moved it.
  const counter = await client.query<{ last_slot: string }>(
    "SELECT last_slot FROM outbox_slots WHERE project_id = $1",
    [projectId],
  );
  result.head = counter.rows.length === 0 ? 0 : Number(counter.rows[0].last_slot);
  return result;
}

async function refusing<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    const e = error as { code?: unknown; message?: unknown; detail?: unknown; hint?: unknown };
    if (typeof e.code === "string" && typeof e.message === "string") {
      throw new DatabaseRefusal(
        e.code,
        e.message,
        typeof e.detail === "string" ? e.detail : undefined,
        typeof e.hint === "string" ? e.hint : undefined,
      );
    }
    throw error;
  }
}
