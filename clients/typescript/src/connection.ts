/**
 * JSON-RPC 2.0 over one transport: requests and their responses, the notifications of a
 * streaming execution routed to the run of their session, and the daemon's own requests
 * (`bridge.llm`), answered by that run's `onLlm` concurrently, with `bridge.cancel` aborting
 * the call's signal.
 */

import { ConnectionClosed, ProtocolError, errorFor } from "./errors.js";
import type { Transport } from "./transport.js";
import type { LlmAnswer, LlmCall } from "./types.js";

/** A JSON-RPC message as the daemon sends it. */
interface Message {
  id?: string | number | null;
  method?: string;
  params?: Record<string, unknown>;
  result?: unknown;
  error?: { code?: number; message?: string; data?: unknown };
}

/** What a streaming run of one session does with the messages about it. */
export interface StreamHandler {
  notify(method: string, params: Record<string, unknown>): void;
  /** Answers a `bridge.llm`; undefined when the run has no onLlm. */
  answerLlm?: (call: LlmCall, signal: AbortSignal) => Promise<LlmAnswer>;
}

export class Connection {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (value: unknown) => void; reject: (err: Error) => void }>();
  private readonly streams = new Map<string, StreamHandler>();
  private readonly llmCalls = new Map<string, AbortController>();
  private closedReason?: string;

  constructor(readonly transport: Transport) {
    transport.onMessage = (text) => this.receive(text);
    transport.onClose = (reason) => this.shut(reason);
  }

  /** Whether the connection has ended. */
  get closed(): boolean {
    return this.closedReason !== undefined;
  }

  /** Calls `method`; its result, or its error as the typed RpcError of its code. */
  call<T = unknown>(method: string, params?: Record<string, unknown>): Promise<T> {
    if (this.closedReason !== undefined) return Promise.reject(new ConnectionClosed(this.closedReason));
    const id = this.nextId++;
    const message: Record<string, unknown> = { jsonrpc: "2.0", id, method };
    if (params !== undefined) message.params = params;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (value: unknown) => void, reject });
      this.transport.send(JSON.stringify(message));
    });
  }

  /** Sends the messages about `sessionId` to `handler` until the returned function is called. */
  stream(sessionId: string, handler: StreamHandler): () => void {
    this.streams.set(sessionId, handler);
    return () => {
      if (this.streams.get(sessionId) === handler) this.streams.delete(sessionId);
    };
  }

  /** Ends the connection. */
  close(): Promise<void> {
    return this.transport.close();
  }

  private receive(text: string): void {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      this.shut(new ProtocolError(`the daemon sent a message that is not JSON: ${String(err)}`).message);
      return;
    }
    for (const message of Array.isArray(parsed) ? parsed : [parsed]) {
      if (typeof message === "object" && message !== null) this.dispatch(message as Message);
    }
  }

  private dispatch(message: Message): void {
    const params = message.params ?? {};
    if (message.method === undefined) {
      if (typeof message.id !== "number") return;
      const waiting = this.pending.get(message.id);
      if (!waiting) return;
      this.pending.delete(message.id);
      if (message.error) waiting.reject(errorFor(message.error));
      else waiting.resolve(message.result);
      return;
    }
    if (message.id !== undefined && message.id !== null) {
      this.serve(message.id, message.method, params);
      return;
    }
    if (message.method === "bridge.cancel") {
      this.llmCalls.get(String(params.call_id))?.abort(new Error("the daemon cancelled the call"));
      return;
    }
    this.streams.get(String(params.session_id))?.notify(message.method, params);
  }

  /** Answers a request of the daemon. */
  private serve(id: string | number, method: string, params: Record<string, unknown>): void {
    if (method !== "bridge.llm") {
      this.respond(id, undefined, { code: -32601, message: `method not found: ${method}` });
      return;
    }
    const call = params as unknown as LlmCall;
    const answer = this.streams.get(call.session_id)?.answerLlm;
    if (!answer) {
      this.respond(id, undefined, { code: -32000, message: "the client that ran this code has no onLlm" });
      return;
    }
    const controller = new AbortController();
    this.llmCalls.set(call.call_id, controller);
    answer(call, controller.signal).then(
      (answered) => this.respond(id, normalise(answered)),
      (err: unknown) => this.respond(id, undefined, { code: -32000, message: err instanceof Error ? err.message : String(err) }),
    ).finally(() => this.llmCalls.delete(call.call_id));
  }

  private respond(id: string | number, result: unknown, error?: { code: number; message: string }): void {
    if (this.closedReason !== undefined) return;
    const reply = error === undefined ? { jsonrpc: "2.0", id, result } : { jsonrpc: "2.0", id, error };
    this.transport.send(JSON.stringify(reply));
  }

  private shut(reason: string): void {
    if (this.closedReason !== undefined) return;
    this.closedReason = reason;
    for (const waiting of this.pending.values()) waiting.reject(new ConnectionClosed(reason));
    this.pending.clear();
    for (const controller of this.llmCalls.values()) controller.abort(new ConnectionClosed(reason));
    this.llmCalls.clear();
  }
}

/** The `{answers, usage?}` of what onLlm returned. */
function normalise(answered: LlmAnswer): { answers: string[]; usage?: unknown } {
  if (typeof answered === "string") return { answers: [answered] };
  if (Array.isArray(answered)) return { answers: answered };
  return answered;
}
