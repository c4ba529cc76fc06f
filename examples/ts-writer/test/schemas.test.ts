// The service's own check, with the published JSON Schemas: a good event passes; a payload
// missing a required field and an over-long change id are refused, naming the field.
import assert from "node:assert/strict";
import { test } from "node:test";

import { type Fact, toEvents } from "../src/events.js";
import { EventSchemas, SchemaRefusal } from "../src/schemas.js";
import { SCHEMAS } from "./paths.js";

const schemas = EventSchemas.load(SCHEMAS);

function events(...facts: Fact[]) {
  const writer = {
    tenantId: "tenant-1",
    projectId: "proj-ts",
    actor: "service:ts-writer",
    versionOf: (type: string) => schemas.versionOf(type),
  };
  return toEvents(writer, facts, new Date("2026-01-02T03:04:05.678Z"));
}

test("a good event passes both schemas", () => {
  const [event] = events({
    eventType: "task.completed",
    changeId: "chg-1",
    taskId: "t1",
    payload: { agentId: "agent-1" },
  });
  assert.equal(event.timestamp, "2026-01-02T03:04:05.678Z");
  assert.deepEqual(schemas.problems(event), []);
  schemas.check([event]);
});

test("a task.completed without agentId is refused by its payload schema", () => {
  const bad = events({ eventType: "task.completed", changeId: "chg-1", taskId: "t1", payload: {} });
  assert.throws(
    () => schemas.check(bad),
    (error: unknown) =>
      error instanceof SchemaRefusal &&
      error.problems.length === 1 &&
      error.problems[0].includes("payload must have required property 'agentId'"),
  );
});

test("a change id of 300 characters is refused by the envelope schema", () => {
  const [bad] = events({
    eventType: "change.created",
    changeId: "c".repeat(300),
    payload: {},
  });
  const problems = schemas.problems(bad);
  assert.ok(
    problems.some((p) => p.includes("envelope/changeId must NOT have more than 200 characters")),
    problems.join("\n"),
  );
});

test("every cataloged type has a payload schema the envelope names a version of", () => {
  for (const type of ["change.created", "task.created", "task.started", "task.completed"]) {
    assert.equal(schemas.versionOf(type), 1, type);
  }
  assert.equal(schemas.versionOf("acme.own_type"), 1);
});
