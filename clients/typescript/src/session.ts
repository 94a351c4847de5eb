/**
 * `Session`: one session of the daemon, reached through a JSON-RPC connection (the client's
 * socket or child, or the session's own WebSocket). `run` streams: output, displays and
 * `input()` reach the callbacks in the order they happened, `onLlm` answers the code's LLM
 * calls, and an `AbortSignal` interrupts. One run of a session streams at a time on a
 * connection; later runs of that `Session` wait for it.
 */

import type { Connection } from "./connection.js";
import { ConnectionClosed, UnknownSession } from "./errors.js";
import { SessionFiles, type FileRoutes } from "./files.js";
import type {
  Checkpoint,
  Created,
  Display,
  ExecutionResult,
  ForkResult,
  LlmAnswer,
  RunOptions,
} from "./types.js";

export class Session {
  private turn: Promise<unknown> = Promise.resolve();
  /** The files of the session's work directory (`session.files.*`). */
  readonly files: SessionFiles;

  constructor(
    private readonly connection: Connection,
    readonly id: string,
    /** What `session.create` answered (absent for a session looked up by id or name). */
    readonly created?: Created,
    /** Called after `close`, to end what the session owns (its WebSocket). */
    private readonly onClosed?: () => Promise<void>,
    /** The HTTP file routes, for a session of the HTTP client. */
    fileRoutes?: FileRoutes,
  ) {
    this.files = new SessionFiles(connection, id, fileRoutes);
  }

  /** Runs `code`; the result of docs/protocol.md `session.execute`, whatever its status. */
  run(code: string, options: RunOptions = {}): Promise<ExecutionResult> {
    if (options.signal?.aborted) return Promise.reject(options.signal.reason);
    const turn = this.turn.then(() => this.stream(code, options));
    this.turn = turn.catch(() => undefined);
    return turn;
  }

  private async stream(code: string, options: RunOptions): Promise<ExecutionResult> {
    const { signal } = options;
    signal?.throwIfAborted();
    const inputs: Promise<unknown>[] = [];
    const stop = this.connection.stream(this.id, {
      notify: (method, params) => {
        if (method === "session.output") {
          const text = String(params.data ?? "");
          (params.stream === "stderr" ? options.onStderr : options.onStdout)?.(text);
        } else if (method === "session.display") {
          options.onDisplay?.(params as unknown as Display);
        } else if (method === "session.input_request") {
          inputs.push(this.answerInput(params, options));
        }
      },
      answerLlm: options.onLlm
        ? async (call, callSignal): Promise<LlmAnswer> => options.onLlm!(call, { signal: callSignal })
        : undefined,
    });
    const interrupt = () => {
      this.interrupt().catch(() => undefined);
    };
    signal?.addEventListener("abort", interrupt, { once: true });
    try {
      const params: Record<string, unknown> = { ...options.params, session_id: this.id, code, stream: true };
      if (options.timeoutS !== undefined) params.timeout_s = options.timeoutS;
      return await this.connection.call<ExecutionResult>("session.execute", params);
    } finally {
      signal?.removeEventListener("abort", interrupt);
      stop();
      await Promise.allSettled(inputs);
    }
  }

  private async answerInput(params: Record<string, unknown>, options: RunOptions): Promise<void> {
    let value: string | null = null;
    if (options.onInput) {
      value = await options.onInput(String(params.prompt ?? ""), { password: params.password === true });
    }
    await this.connection.call("session.input", {
      session_id: this.id,
      execution_id: params.execution_id,
      value,
    });
  }

  /** Raises KeyboardInterrupt in the running code; false when nothing ran. */
  async interrupt(): Promise<boolean> {
    const answer = await this.connection.call<{ interrupted: boolean }>("session.interrupt", { session_id: this.id });
    return answer.interrupted;
  }

  /** Saves the namespace now. */
  checkpoint(): Promise<Checkpoint> {
    return this.connection.call<Checkpoint>("session.checkpoint", { session_id: this.id });
  }

  /** Brings the namespace back to a checkpoint, the latest when `checkpointId` is absent. */
  restore(checkpointId?: string): Promise<Record<string, unknown>> {
    const params: Record<string, unknown> = { session_id: this.id };
    if (checkpointId !== undefined) params.checkpoint_id = checkpointId;
    return this.connection.call("session.restore", params);
  }

  /**
   * Clones of the session (`session.fork`): `count` of them (1 to 16; the number of `names`
   * when given, else 1), each starting from the namespace as it is between executions (a
   * running execution is waited for), then independent. Reach each with the client's
   * `session(id)` (a session on its own WebSocket reaches only itself).
   */
  fork(options: { count?: number; names?: string[] } = {}): Promise<ForkResult> {
    const params: Record<string, unknown> = { session_id: this.id };
    if (options.count !== undefined) params.count = options.count;
    if (options.names !== undefined) params.names = options.names;
    return this.connection.call<ForkResult>("session.fork", params);
  }

  /**
   * `session.hint`: code the caller expects to run soon, computed ahead while the session is
   * idle (at most 64 snippets; a call replaces the earlier hints). Resolves to how many
   * snippets were taken: 0 for a session without proactive computation. `info()` lists in
   * `proactive.ahead` what is computed and would answer now.
   */
  async hint(code: string[]): Promise<number> {
    const reply = await this.connection.call<{ accepted: number }>("session.hint", { session_id: this.id, code });
    return reply.accepted;
  }

  /** `session.info`: state, variables, durability, limits, sandbox, what is computed ahead. */
  info(): Promise<Record<string, unknown>> {
    return this.connection.call("session.info", { session_id: this.id });
  }

  /** Ends the session; with `checkpoint`, a last checkpoint keeps it on disk. */
  async close(options: { checkpoint?: boolean } = {}): Promise<void> {
    try {
      await this.connection.call("session.close", { session_id: this.id, checkpoint: options.checkpoint === true });
    } finally {
      await this.onClosed?.();
    }
  }

  /** `await using session = ...`: closes it, unless it is gone already. */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.close();
    } catch (err) {
      if (!(err instanceof UnknownSession || err instanceof ConnectionClosed)) throw err;
    }
  }
}
