// The stream and partition of a project, against the published partitioning vectors
// (schemas/partitioning.json) and the published FNV-1a values.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { fnv1a32, murmur2, partitionFor, streamIndex, streamName } from "../src/hashing.js";
import { SCHEMAS } from "./paths.js";

interface Vector {
  project_id: string;
  utf8_hex: string;
  fnv1a32: number;
  stream: number;
  murmur2: number;
  partitions: Record<string, number>;
}

const file = JSON.parse(readFileSync(join(SCHEMAS, "partitioning.json"), "utf8")) as {
  streams: number;
  vectors: Vector[];
};

test("fnv1a32 gives the published FNV-1a values", () => {
  const published: [string, number][] = [
    ["", 0x811c9dc5],
    ["a", 0xe40c292c],
    ["foobar", 0xbf9cf968],
    ["chongo was here!\n", 0xd49930d5],
  ];
  for (const [text, value] of published) assert.equal(fnv1a32(text), value, text);
});

test("every vector: the UTF-8 bytes, fnv1a32, the stream, murmur2 and each partition", () => {
  assert.ok(file.vectors.length >= 20);
  for (const v of file.vectors) {
    const id = v.project_id;
    assert.equal(Buffer.from(id, "utf8").toString("hex"), v.utf8_hex, id);
    assert.equal(fnv1a32(id), v.fnv1a32, id);
    assert.equal(streamIndex(id, file.streams), v.stream, id);
    assert.equal(murmur2(Buffer.from(id, "utf8")), v.murmur2, id);
    for (const [partitions, partition] of Object.entries(v.partitions)) {
      assert.equal(partitionFor(id, Number(partitions)), partition, `${id} of ${partitions}`);
    }
  }
});

test("the stream's topic name and a bad stream count", () => {
  assert.equal(streamName(3, "prod"), "rhumbatron_events_03_prod");
  assert.throws(() => streamIndex("p", 0), /at least 1/);
});
