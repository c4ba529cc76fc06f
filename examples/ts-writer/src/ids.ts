// Event ids: "evt_" and 32 lowercase hex characters. A stable id is the first 16 bytes of
// SHA-256 over the change id, the event type, the task id and an optional key, each field
// length-prefixed (4 bytes, big-endian) so fields cannot run together, and an absent field
// (null) written as the single byte 0xff, which no length prefix of a real field starts with.
// The same fact written twice (a retried request) gets the same id, and the outbox ignores
// the repeat.
import { createHash, randomBytes } from "node:crypto";

export const EVENT_ID_PREFIX = "evt_";

function field(value: string | null | undefined): Buffer {
  if (value === null || value === undefined) {
    return Buffer.from([0xff]);
  }
  const raw = Buffer.from(value, "utf8");
  const length = Buffer.alloc(4);
  length.writeUInt32BE(raw.length);
  return Buffer.concat([length, raw]);
}

export function stableEventId(
  changeId: string | null,
  eventType: string,
  taskId: string | null,
  key: string | null = null,
): string {
  const digest = createHash("sha256");
  for (const part of [changeId, eventType, taskId, key]) {
    digest.update(field(part));
  }
  return EVENT_ID_PREFIX + digest.digest().subarray(0, 16).toString("hex");
}

/** For a project-wide fact with no natural key: generated once, inside the writer's work. */
export function newEventId(): string {
  return EVENT_ID_PREFIX + randomBytes(16).toString("hex");
}
