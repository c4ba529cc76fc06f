// The published JSON Schemas (draft 2020-12) the service checks its events against before it
// writes them, found through the folder's index, catalog.json: the event envelope's schema
// (event.schema.json) and, for each cataloged (type, version), its payload's
// (events/<type>.v<version>.schema.json). A type the catalog does not name (a team's own) has
// only its envelope checked, as Rhumbatron does.
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Ajv2020, type ErrorObject, type ValidateFunction } from "ajv/dist/2020.js";
import addFormatsModule from "ajv-formats";

import type { WireEvent } from "./events.js";

// ajv-formats is CommonJS: under ES modules its function is the default export's default.
const addFormats = addFormatsModule as unknown as typeof addFormatsModule.default;

interface CatalogIndex {
  envelopes: { event: { file: string } };
  events: { type: string; version: number; file: string }[];
}

/** TS_WRITER_SCHEMAS, or the schemas folder of the Rhumbatron checkout this example sits in
 * (examples/ts-writer). */
export function defaultSchemasDir(): string {
  if (process.env.TS_WRITER_SCHEMAS) return process.env.TS_WRITER_SCHEMAS;
  const here = dirname(fileURLToPath(import.meta.url)); // dist/src or dist/test
  return resolve(here, "..", "..", "..", "..", "schemas");
}

export class SchemaRefusal extends Error {
  constructor(readonly problems: string[]) {
    super(`refused by the JSON Schemas: ${problems.join("; ")}`);
    this.name = "SchemaRefusal";
  }
}

export class EventSchemas {
  private constructor(
    private readonly envelope: ValidateFunction,
    private readonly payloads: Map<string, ValidateFunction>,
    readonly latest: Map<string, number>,
  ) {}

  /** Reads the schemas `dir`'s catalog.json names, once; throws naming a file it cannot read. */
  static load(dir: string = defaultSchemasDir()): EventSchemas {
    const ajv = new Ajv2020({ allErrors: true, strict: true });
    addFormats(ajv);
    const index = readJson(join(dir, "catalog.json")) as CatalogIndex;
    const envelope = ajv.compile(readJson(join(dir, index.envelopes.event.file)));
    const payloads = new Map<string, ValidateFunction>();
    const latest = new Map<string, number>();
    for (const { type, version, file } of index.events) {
      payloads.set(`${type}@${version}`, ajv.compile(readJson(join(dir, file))));
      latest.set(type, Math.max(latest.get(type) ?? 0, version));
    }
    return new EventSchemas(envelope, payloads, latest);
  }

  /** The newest version of `type` the schemas know; 1 for a type they do not catalog. */
  versionOf(type: string): number {
    return this.latest.get(type) ?? 1;
  }

  /** What is wrong with `event` (its envelope, then its payload), or an empty list. */
  problems(event: WireEvent): string[] {
    const where = `${event.eventType} ${event.eventId}`;
    if (!this.envelope(event)) {
      return describe(this.envelope.errors, `${where}: envelope`);
    }
    const payload = this.payloads.get(`${event.eventType}@${event.eventVersion}`);
    if (payload !== undefined && !payload(event.payload)) {
      return describe(payload.errors, `${where}: payload`);
    }
    return [];
  }

  /** Throws a SchemaRefusal listing every problem of every event; nothing when all pass. */
  check(events: WireEvent[]): void {
    const problems = events.flatMap((event) => this.problems(event));
    if (problems.length > 0) throw new SchemaRefusal(problems);
  }
}

function readJson(path: string): object {
  try {
    return JSON.parse(readFileSync(path, "utf8")) as object;
  } catch (error) {
    throw new Error(
      `cannot read ${path} (${String(error)}): point --schemas or TS_WRITER_SCHEMAS at the ` +
        "schemas folder of a Rhumbatron checkout",
    );
  }
}

function describe(errors: ErrorObject[] | null | undefined, where: string): string[] {
  return (errors ?? []).map((e) => `${where}${e.instancePath || ""} ${e.message ?? "is invalid"}`);
}
