#!/usr/bin/env node
// ts-writer: writes a project's events through Rhumbatron's PostgreSQL outbox, in its own
// transaction beside its own state, after checking each event against the published JSON
// Schemas. Prints one JSON object on stdout: what was written (slots, duplicates, the project's
// last slot, the events it had not seen) and the project's stream; or, refused, why.
//
//   ts-writer --database URL --tenant T --project P --events FILE [--via append|insert]
//             [--seen-slot N] [--strict] [--streams 8] [--partitions P] [--schemas DIR]
//             [--actor service:ts-writer] [--skip-schema-check]
//
// Exit status: 0 written, 2 a usage error, 3 refused by the JSON Schemas (nothing sent to the
// database), 4 refused by the database (nothing committed), 1 anything else.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import pg from "pg";

import { type Fact, type WireEvent, toEvents } from "./events.js";
import { partitionFor, streamIndex } from "./hashing.js";
import { type AppendResult, DatabaseRefusal, appendEvents, insertEach } from "./outbox.js";
import { EventSchemas, SchemaRefusal, defaultSchemasDir } from "./schemas.js";

const USAGE = 2;
const SCHEMA_REFUSED = 3;
const DATABASE_REFUSED = 4;

class UsageError extends Error {}

interface Options {
  database: string;
  tenant: string;
  project: string;
  actor: string;
  events: string;
  via: "append" | "insert";
  seenSlot: number | null;
  strict: boolean;
  streams: number;
  partitions: number | null;
  schemas: string;
  skipSchemaCheck: boolean;
}

function options(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      database: { type: "string", default: process.env.DATABASE_URL },
      tenant: { type: "string" },
      project: { type: "string" },
      actor: { type: "string", default: "service:ts-writer" },
      events: { type: "string" },
      via: { type: "string", default: "append" },
      "seen-slot": { type: "string" },
      strict: { type: "boolean", default: false },
      streams: { type: "string", default: "8" },
      partitions: { type: "string" },
      schemas: { type: "string", default: defaultSchemasDir() },
      "skip-schema-check": { type: "boolean", default: false },
    },
    strict: true,
  });
  for (const name of ["database", "tenant", "project", "events"] as const) {
    if (!values[name]) throw new UsageError(`--${name} is required`);
  }
  if (values.via !== "append" && values.via !== "insert") {
    throw new UsageError(`--via is append or insert, not ${values.via}`);
  }
  if (values.via === "insert" && (values["seen-slot"] !== undefined || values.strict)) {
    throw new UsageError(
      "--seen-slot and --strict go with --via append (a plain INSERT reports no missed events)",
    );
  }
  return {
    database: values.database as string,
    tenant: values.tenant as string,
    project: values.project as string,
    actor: values.actor as string,
    events: values.events as string,
    via: values.via,
    seenSlot: optional("--seen-slot", values["seen-slot"], 0),
    strict: values.strict as boolean,
    streams: count("--streams", values.streams as string, 1),
    partitions: optional("--partitions", values.partitions, 1),
    schemas: values.schemas as string,
    skipSchemaCheck: values["skip-schema-check"] as boolean,
  };
}

function count(flag: string, text: string, least: number): number {
  const value = Number(text);
  if (!Number.isSafeInteger(value) || value < least) {
    throw new UsageError(
      `${flag} takes a whole number of at least ${least}, not ${JSON.stringify(text)}`,
    );
  }
  return value;
}

function optional(flag: string, text: string | undefined, least: number): number | null {
  return text === undefined ? null : count(flag, text, least);
}

function readFacts(path: string): Fact[] {
  const facts: unknown = JSON.parse(readFileSync(path === "-" ? 0 : path, "utf8"));
  if (!Array.isArray(facts)) throw new UsageError(`${path} must hold a JSON array of events`);
  return facts as Fact[];
}

/** The service's own state, in the same transaction as its events: the last fact written of
 * each task. A repeat (an event the outbox already had) changes nothing, so a retried request
 * cannot turn a task's state back. */
async function recordOwnState(
  client: pg.ClientBase,
  events: WireEvent[],
  written: string[],
): Promise<void> {
  await client.query(
    `CREATE TABLE IF NOT EXISTS ts_writer_tasks (
       project_id text NOT NULL, task_id text NOT NULL, last_event text NOT NULL,
       PRIMARY KEY (project_id, task_id))`,
  );
  const fresh = new Set(written);
  for (const event of events) {
    if (event.taskId === undefined || !fresh.has(event.eventId)) continue;
    await client.query(
      `INSERT INTO ts_writer_tasks (project_id, task_id, last_event) VALUES ($1, $2, $3)
       ON CONFLICT (project_id, task_id) DO UPDATE SET last_event = excluded.last_event`,
      [event.projectId, event.taskId, event.eventType],
    );
  }
}

async function write(opts: Options): Promise<Record<string, unknown>> {
  const schemas = EventSchemas.load(opts.schemas);
  const facts = readFacts(opts.events);
  const events = toEvents(
    {
      tenantId: opts.tenant,
      projectId: opts.project,
      actor: opts.actor,
      versionOf: (type) => schemas.versionOf(type),
    },
    facts,
    new Date(),
  );
  if (!opts.skipSchemaCheck) schemas.check(events);
  const client = new pg.Client({ connectionString: opts.database, application_name: "ts-writer" });
  await client.connect();
  let result: AppendResult;
  try {
    await client.query("BEGIN");
    try {
      if (opts.via === "append") {
        result = await appendEvents(client, opts.project, opts.tenant, events, {
          seenSlot: opts.seenSlot,
          strict: opts.strict,
        });
      } else {
        result = await insertEach(client, opts.project, events);
      }
      await recordOwnState(client, events, result.eventIds);
      await client.query("COMMIT");
    } catch (error) {
      await client.query("ROLLBACK");
      throw error;
    }
  } finally {
    await client.end();
  }
  const stream = streamIndex(opts.project, opts.streams);
  return {
    ...result,
    stream,
    streams: opts.streams,
    ...(opts.partitions === null ? {} : { partition: partitionFor(opts.project, opts.partitions) }),
  };
}

async function main(): Promise<number> {
  let opts: Options;
  try {
    opts = options(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`ts-writer: ${(error as Error).message}\n`);
    return USAGE;
  }
  try {
    process.stdout.write(`${JSON.stringify(await write(opts))}\n`);
    return 0;
  } catch (error) {
    if (error instanceof SchemaRefusal) {
      process.stdout.write(`${JSON.stringify({ refused: "schema", problems: error.problems })}\n`);
      process.stderr.write(`ts-writer: ${error.message}\n`);
      return SCHEMA_REFUSED;
    }
    if (error instanceof DatabaseRefusal) {
      process.stdout.write(
        `${JSON.stringify({
          refused: "database",
          sqlstate: error.sqlstate,
          message: error.databaseMessage,
          detail: error.detail,
          hint: error.hint,
        })}\n`,
      );
      process.stderr.write(`ts-writer: ${error.message}\n`);
      return DATABASE_REFUSED;
    }
    if (error instanceof UsageError) {
      process.stderr.write(`ts-writer: ${error.message}\n`);
      return USAGE;
    }
    process.stderr.write(`ts-writer: ${(error as Error).stack ?? String(error)}\n`);
    return 1;
  }
}

process.exitCode = await main();
