// Verifying a Standard Webhooks signature, as Rhumbatron's HTTP handler signs each command:
// `webhook-signature` holds one or more `v1,<base64 HMAC-SHA256>` entries, space-separated (one
// per secret the worker holds, during a rotation), over `<webhook-id>.<webhook-timestamp>.<body>`,
// keyed with the base64-decoded bytes after `whsec_`.
import { createHmac, timingSafeEqual } from "node:crypto";

export type Verdict = { ok: true } | { ok: false; reason: string };

export function keysOf(secrets: string): Buffer[] {
  const keys = secrets
    .split(/\s+/)
    .filter((s) => s.length > 0)
    .map((secret, n) => {
      if (!secret.startsWith("whsec_")) {
        throw new Error(`secret ${n + 1} does not start with whsec_`);
      }
      return Buffer.from(secret.slice("whsec_".length), "base64");
    });
  if (keys.length === 0) throw new Error("no secret given");
  return keys;
}

export function sign(key: Buffer, id: string, timestamp: string, body: Buffer): string {
  const mac = createHmac("sha256", key);
  mac.update(`${id}.${timestamp}.`);
  mac.update(body);
  return `v1,${mac.digest("base64")}`;
}

export function verify(
  keys: Buffer[],
  headers: { id?: string; timestamp?: string; signature?: string },
  body: Buffer,
  nowS: number = Math.floor(Date.now() / 1000),
  toleranceS = 300,
): Verdict {
  const { id, timestamp, signature } = headers;
  if (!id || !timestamp || !signature) return { ok: false, reason: "missing webhook-* headers" };
  if (!/^\d+$/.test(timestamp)) return { ok: false, reason: "webhook-timestamp is not a number" };
  if (Math.abs(nowS - Number(timestamp)) > toleranceS) {
    return { ok: false, reason: "webhook-timestamp too far from this clock" };
  }
  const given = signature.split(" ").filter((s) => s.startsWith("v1,"));
  for (const key of keys) {
    const want = Buffer.from(sign(key, id, timestamp, body));
    for (const candidate of given) {
      const got = Buffer.from(candidate);
      if (got.length === want.length && timingSafeEqual(got, want)) return { ok: true };
    }
  }
  return { ok: false, reason: "no signature matches" };
}
