// Where a project's events go (docs/contract.md, "Partitioning"): the stream is
// fnv1a32(utf8(projectId)) mod the environment's stream count; inside the stream's topic the
// partition is (murmur2(utf8(projectId)) & 0x7fffffff) mod its partitions, the Java client's
// default partitioner. schemas/partitioning.json holds the vectors the tests check these against.

const FNV_OFFSET_BASIS = 0x811c9dc5;
const FNV_PRIME = 0x01000193;
const MURMUR2_SEED = 0x9747b28c;
const MURMUR2_M = 0x5bd1e995;

/** 32-bit FNV-1a over the UTF-8 bytes of `text`, as an unsigned number. */
export function fnv1a32(text: string): number {
  let value = FNV_OFFSET_BASIS;
  for (const byte of Buffer.from(text, "utf8")) {
    // Math.imul keeps the product in 32 bits (a plain * would lose the low bits to floats).
    value = Math.imul(value ^ byte, FNV_PRIME);
  }
  return value >>> 0;
}

/** The index of the stream that carries `projectId`'s events, among `streams`. */
export function streamIndex(projectId: string, streams: number): number {
  if (!Number.isInteger(streams) || streams < 1) {
    throw new RangeError(`streams must be a whole number of at least 1, not ${streams}`);
  }
  return fnv1a32(projectId) % streams;
}

/** The stream's topic name: rhumbatron_events_<index, two digits>_<env>. */
export function streamName(index: number, env: string): string {
  return `rhumbatron_events_${String(index).padStart(2, "0")}_${env}`;
}

/** The Java client's Utils.murmur2 over `data`, as an unsigned number. */
export function murmur2(data: Uint8Array): number {
  const length = data.length;
  let h = (MURMUR2_SEED ^ length) >>> 0;
  const whole = length - (length % 4);
  for (let i = 0; i < whole; i += 4) {
    let k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24);
    k = Math.imul(k, MURMUR2_M);
    k ^= k >>> 24;
    k = Math.imul(k, MURMUR2_M);
    h = Math.imul(h, MURMUR2_M) ^ k;
  }
  switch (length % 4) {
    case 3:
      h ^= data[whole + 2] << 16;
    // falls through
    case 2:
      h ^= data[whole + 1] << 8;
    // falls through
    case 1:
      h ^= data[whole];
      h = Math.imul(h, MURMUR2_M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, MURMUR2_M);
  h ^= h >>> 15;
  return h >>> 0;
}

/** The partition of a topic of `partitions` that a record keyed by `key` goes to. */
export function partitionFor(key: string, partitions: number): number {
  return (murmur2(Buffer.from(key, "utf8")) & 0x7fffffff) % partitions;
}
