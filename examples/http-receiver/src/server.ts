// A reference receiver of Rhumbatron's HTTP handler contract (docs/handlers.md): it verifies the
// signature, answers 2xx for a command it already did, and replies by the status table. What a
// command "does" here is decided by its payload's `mode`, so that every row of the table can be
// shown; a real service puts its own work where `work` is.
//
//   RHUMBATRON_HTTP_HANDLER_SECRETS="whsec_..." PORT=8080 node dist/src/server.js
//
// Each command done is one JSON line on stdout and, when RECEIVER_JOURNAL names a file, there.
import { appendFileSync } from "node:fs";
import { createServer, IncomingMessage, ServerResponse } from "node:http";

import { keysOf, verify } from "./signature.js";

const MAX_BODY = 1 << 20;

interface Command {
  commandId: string;
  commandType: string;
  projectId: string;
  payload: Record<string, unknown>;
}

interface Reply {
  status: number;
  headers?: Record<string, string>;
  body?: unknown;
}

const done = new Set<string>(); // a real service keeps this in its database

function work(command: Command, attempt: number, webhookId: string): Reply {
  switch (command.payload.mode) {
    case "conflict": // permanent: the worker dead-letters it with this text
      return { status: 409, body: `candidate for ${command.projectId} already exists` };
    case "later": // not yet: the worker retries after Retry-After
      if (attempt === 1) return { status: 503, headers: { "retry-after": "1" } };
      break;
    case "follow": // done, and two follow-up commands sent with the outcome
      return {
        status: 200,
        body: {
          commands: [
            { commandType: "change.dispatch", projectId: command.projectId, payload: { from: command.commandId } },
            { commandType: "index.build", projectId: command.projectId, payload: { generation: 1 } },
          ],
        },
      };
    case "more": // more work: delivered again (a new webhook-id each time) until the third
      if (!webhookId.includes(".d3")) return { status: 200, body: { more_work: true } };
      break;
  }
  return { status: 204 };
}

function send(res: ServerResponse, reply: Reply): void {
  const text =
    reply.body === undefined ? "" : typeof reply.body === "string" ? reply.body : JSON.stringify(reply.body);
  res.writeHead(reply.status, {
    ...(text && typeof reply.body !== "string" ? { "content-type": "application/json" } : {}),
    ...reply.headers,
  });
  res.end(text);
}

function header(req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name];
  return Array.isArray(value) ? value[0] : value;
}

export function receiver(secrets: string, journal?: string) {
  const keys = keysOf(secrets);
  return createServer((req, res) => {
    if (req.method !== "POST") return send(res, { status: 405 });
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY) req.destroy();
      else chunks.push(chunk);
    });
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const webhookId = header(req, "webhook-id") ?? "";
      const verdict = verify(
        keys,
        { id: webhookId, timestamp: header(req, "webhook-timestamp"), signature: header(req, "webhook-signature") },
        body,
      );
      if (!verdict.ok) return send(res, { status: 401, body: verdict.reason });
      let command: Command;
      try {
        command = JSON.parse(body.toString("utf8")) as Command;
      } catch {
        return send(res, { status: 400, body: "not JSON" });
      }
      const attempt = Number(header(req, "rh-attempt") ?? "1");
      if (done.has(webhookId)) return send(res, { status: 204 }); // already did it: 2xx again
      const reply = work(command, attempt, webhookId);
      if (reply.status >= 200 && reply.status < 300) {
        done.add(webhookId);
        const line = JSON.stringify({ id: command.commandId, type: command.commandType, webhookId, attempt });
        console.log(line);
        if (journal) appendFileSync(journal, line + "\n");
      }
      send(res, reply);
    });
  });
}

const isMain = process.argv[1] !== undefined && import.meta.url.endsWith(process.argv[1].replace(/\\/g, "/"));
if (isMain) {
  const secrets = process.env.RHUMBATRON_HTTP_HANDLER_SECRETS;
  if (!secrets) {
    console.error("RHUMBATRON_HTTP_HANDLER_SECRETS is not set");
    process.exit(2);
  }
  const port = Number(process.env.PORT ?? "8080");
  receiver(secrets, process.env.RECEIVER_JOURNAL).listen(port, "127.0.0.1", () => {
    console.error(`receiver listening on 127.0.0.1:${port}`);
  });
}
