// Stable event ids, against the values Rhumbatron's Python computes (test/stable-ids.json).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { newEventId, stableEventId } from "../src/ids.js";
import { PACKAGE } from "./paths.js";

interface Vector {
  changeId: string | null;
  eventType: string;
  taskId: string | null;
  key: string | null;
  eventId: string;
}

const { vectors } = JSON.parse(
  readFileSync(join(PACKAGE, "test", "stable-ids.json"), "utf8"),
) as { vectors: Vector[] };

test("stableEventId gives Python's stable_event_id for every vector", () => {
  assert.ok(vectors.length > 0);
  for (const v of vectors) {
    const id = stableEventId(v.changeId, v.eventType, v.taskId, v.key);
    assert.equal(id, v.eventId, JSON.stringify(v));
  }
});

test("fields cannot run together, and absent is not empty", () => {
  assert.notEqual(stableEventId("ab", "t.x", "c"), stableEventId("a", "t.x", "bc"));
  assert.notEqual(stableEventId(null, "t.x", null), stableEventId("", "t.x", null));
});

test("a new id has the envelope's form", () => {
  assert.match(newEventId(), /^evt_[0-9a-f]{32}$/);
});
