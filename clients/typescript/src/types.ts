/**
 * The JSON shapes of docs/protocol.md that the client hands out, as the daemon sends them
 * (snake_case), and the options of its calls.
 */

/** `session.create` params (less `owner` rules: see docs/protocol.md). */
export interface SessionOptions {
  name?: string;
  owner?: string;
  python?: string;
  cwd?: string;
  env?: Record<string, string>;
  limits?: {
    memory_mb?: number;
    cpu_s?: number;
    open_files?: number;
    processes?: number;
    timeout_s?: number;
    output_bytes?: number;
    /** Largest file the files API writes. */
    file_bytes?: number;
    /** Most bytes of files the work directory may hold after an API write. */
    disk_mb?: number;
  };
  proactive?: boolean;
  network?: boolean;
  /** `true`: the engine's `[llm]` answers `llm_query`; `"client"`: the `onLlm` of each run. */
  llm?: boolean | "client";
}

/** `session.create` result. */
export interface Created {
  session_id: string;
  pid: number | null;
  python_version: string | null;
  warm: boolean;
  attached: boolean;
  restored: boolean;
}

/** `session.fork` result: the clones, how long the fork took, and the threads of the
 * source's code that were running at the fork (none runs in a clone). */
export interface ForkResult {
  sessions: { session_id: string; pid: number | null; name?: string }[];
  duration_ms: number;
  threads: number;
}

/** One entry of `session.files.list`. */
export interface FileEntry {
  name: string;
  type: "file" | "dir";
  size: number;
  /** Seconds since the epoch. */
  mtime: number;
}

/** One rich output (`display` of the result, `session.display`). */
export interface Display {
  mime: string;
  data: string;
}

/** `session.execute` result. */
export interface ExecutionResult {
  execution_id: string;
  execution_count: number;
  status: "ok" | "error" | "timeout" | "interrupted" | "crashed";
  stdout: string;
  stderr: string;
  result: { repr: string; type: string; html?: string } | null;
  display: Display[];
  error: { type: string; message: string; traceback: string } | null;
  duration_ms: number;
  from_cache?: boolean;
  recovered?: unknown;
  warnings?: string[];
  [more: string]: unknown;
}

/** `bridge.llm` params: a call of the session's code for the client to answer. */
export interface LlmCall {
  session_id: string;
  execution_id: string;
  call_id: string;
  kind: "llm" | "llm_batched" | "rlm";
  prompts: string[];
  depth: number;
  model?: string;
  context?: unknown;
}

/** What the client's answer used, counted in the daemon's `engine.stats`. */
export interface LlmUsage {
  input_tokens: number;
  output_tokens: number;
  cost?: number;
}

/** An answer to a call: one string (for one prompt), one per prompt, or with usage. */
export type LlmAnswer = string | string[] | { answers: string[]; usage?: LlmUsage };

/** What `session.run` does with what the code does while it runs. */
export interface RunOptions {
  /** Seconds; the session's `limits.timeout_s` when absent. */
  timeoutS?: number;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onDisplay?: (display: Display) => void;
  /** Answers `input()` / `getpass()`; `null` raises EOFError in the code. */
  onInput?: (prompt: string, info: { password: boolean }) => string | null | Promise<string | null>;
  /**
   * Answers the code's `llm_query`, `llm_query_batched` and `rlm_query` (a session created
   * with `llm: "client"`); what it throws raises LlmError in the code. `signal` aborts when
   * the daemon cancels the call (an interrupt, a timeout).
   */
  onLlm?: (call: LlmCall, info: { signal: AbortSignal }) => LlmAnswer | Promise<LlmAnswer>;
  /** Aborting interrupts the running code; the result then says `interrupted`. */
  signal?: AbortSignal;
  /** Other `session.execute` params (`transaction`, `queue`, `cache`, `meta`). */
  params?: Record<string, unknown>;
}

/** `session.checkpoint` result. */
export interface Checkpoint {
  checkpoint_id: string;
  bytes: number;
  [more: string]: unknown;
}
