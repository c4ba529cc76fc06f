// The receiver's own tests, under node's test runner: the signature test vector published in
// Rhumbatron's docs/handlers.md, a rotation, and what must be refused.
import assert from "node:assert/strict";
import { test } from "node:test";

import { keysOf, sign, verify } from "../src/signature.js";

const SECRET = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const BODY = Buffer.from('{"commandId":"cmd_example","commandType":"index.build"}');
const SIGNATURE = "v1,ax+Hi3H0vw/jUnyN/M/sXodLfDHdZlCXXw0sWLw/MyA=";
const NOW = 1767225600;

test("the published test vector", () => {
  const [key] = keysOf(SECRET);
  assert.equal(sign(key, "cmd_example", String(NOW), BODY), SIGNATURE);
  assert.deepEqual(verify([key], { id: "cmd_example", timestamp: String(NOW), signature: SIGNATURE }, BODY, NOW), { ok: true });
});

test("a rotation: either secret's signature passes", () => {
  const other = Buffer.alloc(32, 7);
  const both = `${sign(other, "cmd_example", String(NOW), BODY)} ${SIGNATURE}`;
  assert.equal(verify(keysOf(SECRET), { id: "cmd_example", timestamp: String(NOW), signature: both }, BODY, NOW).ok, true);
});

test("a changed body, another id, an old timestamp or no header is refused", () => {
  const keys = keysOf(SECRET);
  const headers = { id: "cmd_example", timestamp: String(NOW), signature: SIGNATURE };
  assert.equal(verify(keys, headers, Buffer.from(BODY.toString() + " "), NOW).ok, false);
  assert.equal(verify(keys, { ...headers, id: "cmd_other" }, BODY, NOW).ok, false);
  assert.equal(verify(keys, headers, BODY, NOW + 3600).ok, false);
  assert.equal(verify(keys, { id: "cmd_example" }, BODY, NOW).ok, false);
});

test("a secret without whsec_ is refused at start", () => {
  assert.throws(() => keysOf("AAECAwQF"), /whsec_/);
});
