// The events this service writes, as the wire envelope names their fields (camelCase).
import { stableEventId } from "./ids.js";

/** A fact the service's work produced: what happened, to which change and task. */
export interface Fact {
  eventType: string;
  changeId?: string;
  taskId?: string;
  /** Tells two facts of one type about one task apart (a second attempt's start, say). */
  key?: string;
  payload?: Record<string, unknown>;
  /** Only for a fact with no natural key; otherwise the id is derived (ids.ts). */
  eventId?: string;
  eventVersion?: number;
  resource?: string;
  canonicalGeneration?: number;
  causedBy?: string;
  correlationId?: string;
}

/** One event as the outbox stores it and the publisher sends it (the slot comes later). */
export interface WireEvent {
  eventId: string;
  eventType: string;
  eventVersion: number;
  tenantId: string;
  projectId: string;
  changeId?: string;
  taskId?: string;
  actor: string;
  resource?: string;
  canonicalGeneration?: number;
  causedBy?: string;
  correlationId?: string;
  timestamp: string;
  payload: Record<string, unknown>;
  slot?: number;
}

export interface Writer {
  tenantId: string;
  projectId: string;
  actor: string;
  /** The newest version of a type this service writes (the schemas' newest). */
  versionOf: (eventType: string) => number;
}

/** The envelopes of `facts`, all stamped `now` (milliseconds, UTC, as the envelope has it). */
export function toEvents(writer: Writer, facts: Fact[], now: Date): WireEvent[] {
  const timestamp = now.toISOString();
  return facts.map((fact) => {
    const event: WireEvent = {
      eventId:
        fact.eventId ??
        stableEventId(fact.changeId ?? null, fact.eventType, fact.taskId ?? null, fact.key ?? null),
      eventType: fact.eventType,
      eventVersion: fact.eventVersion ?? writer.versionOf(fact.eventType),
      tenantId: writer.tenantId,
      projectId: writer.projectId,
      actor: writer.actor,
      timestamp,
      payload: fact.payload ?? {},
    };
    for (const name of [
      "changeId",
      "taskId",
      "resource",
      "canonicalGeneration",
      "causedBy",
      "correlationId",
    ] as const) {
      if (fact[name] !== undefined) Object.assign(event, { [name]: fact[name] });
    }
    return event;
  });
}
