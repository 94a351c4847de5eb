/**
 * `connect()` and the clients it returns: over the daemon's Unix socket, over a child
 * `pyvisor serve --stdio`, or over HTTP (sessions created with `POST /v1/sessions`, each
 * then driven over its own WebSocket), with a bearer token.
 *
 * Backend selection, as agent CLIs expect: `backend: "auto"` (the default) uses a daemon
 * whose socket answers (`socket`, else `$PYVISOR_SOCKET`, else the default path), and starts
 * `pyvisor serve --stdio` as a child otherwise; `"socket"`, `"stdio"` and `"http"` force one.
 */

import * as os from "node:os";
import * as path from "node:path";

import { Connection } from "./connection.js";
import { ConnectError, errorFor } from "./errors.js";
import { Session } from "./session.js";
import { ChildTransport, SocketTransport, WebSocketTransport } from "./transport.js";
import type { Created, SessionOptions } from "./types.js";

export type Backend = "socket" | "stdio" | "http";

export interface ConnectOptions {
  /** Which way to reach pyvisor; `"auto"`: the socket if a daemon answers, else a child. */
  backend?: Backend | "auto";
  /** The daemon's socket; `$PYVISOR_SOCKET`, else `$XDG_RUNTIME_DIR/pyvisor/pyvisor.sock`, else `~/.pyvisor/pyvisor.sock`. */
  socket?: string;
  /** The `pyvisor` binary of a child: `$PYVISOR_BIN`, else `pyvisor` on `PATH`. */
  pyvisor?: string;
  /** More arguments of the child's `serve --stdio` (`--config FILE`, say). */
  args?: string[];
  /** The child's environment; this process's when absent. */
  env?: NodeJS.ProcessEnv;
  /** Where the child's log goes: nowhere (default) or this process's stderr. */
  stderr?: "inherit" | "ignore";
  /** The daemon's HTTP base (`http://127.0.0.1:8787`), for `backend: "http"`. */
  url?: string;
  /** The bearer token of HTTP, when the daemon has one. */
  token?: string;
  /** How long a socket connection may take. */
  connectTimeoutMs?: number;
}

/** What every client offers. */
export interface Client extends AsyncDisposable {
  /** How this client reaches pyvisor. */
  readonly backend: Backend;
  /** A new session, or the live session `name` (then `created.attached`). */
  createSession(options?: SessionOptions): Promise<Session>;
  /** The live session of this id or name. */
  session(idOrName: string): Promise<Session>;
  /** `engine.health`. */
  health(): Promise<Record<string, unknown>>;
  /** Ends the connection (and the child, if any). */
  close(): Promise<void>;
}

/** The socket where the CLI and the other clients look for the daemon. */
export function defaultSocket(): string {
  if (process.env.PYVISOR_SOCKET) return process.env.PYVISOR_SOCKET;
  if (process.env.XDG_RUNTIME_DIR) return path.join(process.env.XDG_RUNTIME_DIR, "pyvisor", "pyvisor.sock");
  return path.join(os.homedir(), ".pyvisor", "pyvisor.sock");
}

/** Reaches pyvisor as `options` say. */
export async function connect(options: ConnectOptions = {}): Promise<Client> {
  const backend = options.backend ?? "auto";
  if (backend === "http") return HttpClient.open(options);
  const socket = options.socket ?? defaultSocket();
  if (backend === "socket") return RpcClient.overSocket(socket, options.connectTimeoutMs);
  if (backend === "auto") {
    try {
      return await RpcClient.overSocket(socket, options.connectTimeoutMs);
    } catch (err) {
      if (!(err instanceof ConnectError)) throw err;
    }
  }
  const binary = options.pyvisor ?? process.env.PYVISOR_BIN ?? "pyvisor";
  const child = await ChildTransport.start(binary, options.args ?? [], options.env, options.stderr);
  const client = new RpcClient("stdio", new Connection(child));
  try {
    await client.health();
  } catch (err) {
    await client.close();
    throw new ConnectError(`${binary} serve --stdio did not answer: ${err instanceof Error ? err.message : String(err)}`);
  }
  return client;
}

/** A client over one JSON-RPC connection: the socket, or a child's stdin and stdout. */
export class RpcClient implements Client {
  constructor(
    readonly backend: "socket" | "stdio",
    private readonly connection: Connection,
  ) {}

  static async overSocket(socket: string, timeoutMs?: number): Promise<RpcClient> {
    return new RpcClient("socket", new Connection(await SocketTransport.connect(socket, timeoutMs)));
  }

  /** Calls any method of docs/protocol.md. */
  call<T = unknown>(method: string, params?: Record<string, unknown>): Promise<T> {
    return this.connection.call<T>(method, params);
  }

  async createSession(options: SessionOptions = {}): Promise<Session> {
    const created = await this.call<Created>("session.create", { ...options });
    return new Session(this.connection, created.session_id, created);
  }

  async session(idOrName: string): Promise<Session> {
    const info = await this.call<{ session_id: string }>("session.info", { session_id: idOrName });
    return new Session(this.connection, info.session_id);
  }

  health(): Promise<Record<string, unknown>> {
    return this.call("engine.health");
  }

  stats(): Promise<Record<string, unknown>> {
    return this.call("engine.stats");
  }

  close(): Promise<void> {
    return this.connection.close();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** A client of the HTTP API: REST for sessions, a WebSocket per session for the rest. */
export class HttpClient implements Client {
  readonly backend = "http";
  private readonly sockets = new Set<Connection>();

  private constructor(
    private readonly base: string,
    private readonly token?: string,
  ) {}

  static async open(options: ConnectOptions): Promise<HttpClient> {
    if (!options.url) throw new ConnectError("backend http needs the daemon's url");
    const client = new HttpClient(options.url.replace(/\/+$/, ""), options.token);
    await client.health();
    return client;
  }

  private headers(): Record<string, string> {
    return this.token ? { Authorization: `Bearer ${this.token}` } : {};
  }

  /** One HTTP request; its JSON body, or the typed error of its `{error}` body. */
  private async request<T>(method: string, route: string, body?: unknown): Promise<T> {
    let response: Response;
    try {
      response = await fetch(this.base + route, {
        method,
        headers: { ...this.headers(), ...(body === undefined ? {} : { "Content-Type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      throw new ConnectError(`no pyvisor daemon at ${this.base}: ${err instanceof Error ? err.message : String(err)}`);
    }
    const text = await response.text();
    let parsed: unknown = undefined;
    try {
      parsed = text ? JSON.parse(text) : undefined;
    } catch {
      // a body that is not JSON: the status says it
    }
    const error = (parsed as { error?: { code?: number; message?: string } } | undefined)?.error;
    if (!response.ok || error) {
      throw error ? errorFor(error) : new ConnectError(`HTTP ${response.status} from ${route}: ${text.slice(0, 200)}`);
    }
    return parsed as T;
  }

  async createSession(options: SessionOptions = {}): Promise<Session> {
    const created = await this.request<Created>("POST", "/v1/sessions", options);
    return this.open(created.session_id, created);
  }

  async session(idOrName: string): Promise<Session> {
    const info = await this.request<{ session_id: string }>("GET", `/v1/sessions/${encodeURIComponent(idOrName)}`);
    return this.open(info.session_id);
  }

  /** The session over its own WebSocket. */
  private async open(sessionId: string, created?: Created): Promise<Session> {
    const url = this.base.replace(/^http/, "ws") + `/v1/sessions/${encodeURIComponent(sessionId)}/ws`;
    const connection = new Connection(await WebSocketTransport.open(url, this.headers()));
    this.sockets.add(connection);
    const files = { base: `${this.base}/v1/sessions/${encodeURIComponent(sessionId)}/files`, headers: this.headers() };
    const closed = async () => {
      this.sockets.delete(connection);
      await connection.close();
    };
    return new Session(connection, sessionId, created, closed, files);
  }

  health(): Promise<Record<string, unknown>> {
    return this.request("GET", "/healthz");
  }

  async close(): Promise<void> {
    const sockets = [...this.sockets];
    this.sockets.clear();
    await Promise.all(sockets.map((socket) => socket.close().catch(() => undefined)));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}


