/**
 * `PyvisorSandbox`: a drop-in for agent loops written against a Pyodide-style sandbox. It
 * holds one persistent session and offers the usual five calls:
 *
 * ```ts
 * const sandbox = await PyvisorSandbox.create();          // connect() options, plus session options
 * await sandbox.setVariable("data", [1, 2, 3]);            // JSON-able values only
 * const { stdout, stderr, result, error, durationMs } = await sandbox.execute("sum(data)");
 * // result: "6" (the repr of the final expression), error: undefined
 * await sandbox.getVariable("data");                      // [1, 2, 3]
 * await sandbox.reset();                                  // a fresh, empty namespace
 * await sandbox.dispose();                                // the session and the connection end
 * ```
 *
 * `execute` never throws for the code's own failures: `error` holds `Type: message` and the
 * traceback, as it does for a timeout, an interrupt or a crash of the interpreter (after which
 * the session comes back from its latest checkpoint). Values cross as JSON, through the
 * session's own `json` module, so a name or a value can never be run as code.
 */

import { connect, type Client, type ConnectOptions } from "./client.js";
import { SandboxError } from "./errors.js";
import type { Session } from "./session.js";
import type { ExecutionResult, RunOptions, SessionOptions } from "./types.js";

/** What `execute` returns. */
export interface SandboxResult {
  stdout: string;
  stderr: string;
  /** The repr of the code's final expression, if it had one. */
  result?: string;
  /** Why the code did not finish: `Type: message` and the traceback. */
  error?: string;
  durationMs: number;
}

export interface SandboxOptions extends ConnectOptions {
  /** The session's options (`limits`, `llm: "client"`, ...). */
  session?: SessionOptions;
  /** Callbacks of every `execute` (`onStdout`, `onLlm`, ...). */
  run?: Omit<RunOptions, "signal" | "params">;
}

const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*$/;

export class PyvisorSandbox implements AsyncDisposable {
  private constructor(
    private readonly client: Client,
    private session: Session,
    private readonly options: SandboxOptions,
  ) {}

  /** Connects as `options` say (the daemon's socket, else a child) and opens a session. */
  static async create(options: SandboxOptions = {}): Promise<PyvisorSandbox> {
    const client = await connect(options);
    try {
      return new PyvisorSandbox(client, await client.createSession(options.session), options);
    } catch (err) {
      await client.close();
      throw err;
    }
  }

  /** Runs `code` in the session; aborting `signal` interrupts it. */
  async execute(code: string, signal?: AbortSignal): Promise<SandboxResult> {
    return outcome(await this.session.run(code, { ...this.options.run, signal }));
  }

  /** Binds `name` to `value` (anything JSON can carry) in the session. */
  async setVariable(name: string, value: unknown): Promise<void> {
    const text = JSON.stringify(value);
    if (text === undefined) throw new SandboxError(`${name}: the value is not JSON-able`);
    // A JSON string literal is a valid Python string literal.
    const ran = await this.session.run(`${checked(name)} = __import__('json').loads(${JSON.stringify(text)})`);
    failed(ran, `set ${name}`);
  }

  /** The value of `name`, as JSON carries it; throws when it is unbound or not JSON-able. */
  async getVariable(name: string): Promise<unknown> {
    // Printed, not the final expression, whose repr would need unquoting.
    const printed = await this.session.run(`print(__import__('json').dumps(${checked(name)}), end='')`);
    failed(printed, `get ${name}`);
    return JSON.parse(printed.stdout);
  }

  /** Ends the session and starts a fresh one: an empty namespace. */
  async reset(): Promise<void> {
    const old = this.session;
    this.session = await this.client.createSession(this.options.session);
    await old.close().catch(() => undefined);
  }

  /** Ends the session and the connection (and a child daemon, if one was started). */
  async dispose(): Promise<void> {
    try {
      await this.session.close();
    } finally {
      await this.client.close();
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.dispose();
  }
}

function checked(name: string): string {
  if (!IDENTIFIER.test(name)) throw new SandboxError(`${JSON.stringify(name)} is not a Python name`);
  return name;
}

function outcome(ran: ExecutionResult): SandboxResult {
  const error = ran.error
    ? `${ran.error.type}: ${ran.error.message}\n${ran.error.traceback ?? ""}`.trimEnd()
    : ran.status === "ok"
      ? undefined
      : `the execution ended ${ran.status}`;
  return { stdout: ran.stdout, stderr: ran.stderr, result: ran.result?.repr, error, durationMs: ran.duration_ms };
}

function failed(ran: ExecutionResult, what: string): void {
  const error = outcome(ran).error;
  if (error !== undefined) throw new SandboxError(`${what}: ${error}`);
}
