/**
 * The byte-level ways to reach a daemon, each carrying whole JSON-RPC messages: the Unix
 * socket and a child `pyvisor serve --stdio` (newline-delimited JSON), and a session's
 * WebSocket (one message per text frame).
 */

import { spawn, type ChildProcess } from "node:child_process";
import * as net from "node:net";

import { ConnectError } from "./errors.js";
import { WebSocketClient } from "./websocket.js";

/** Whole messages in and out. */
export interface Transport {
  /** Sends one JSON-RPC message (its text). */
  send(text: string): void;
  /** Called with each message from the daemon. */
  onMessage: (text: string) => void;
  /** Called once when the transport ends, with why. */
  onClose: (reason: string) => void;
  /** Ends the transport; resolves once it is gone. */
  close(): Promise<void>;
}

/** Splits a byte stream into lines and calls `onLine` with each. */
class Lines {
  private pending = "";
  constructor(private readonly onLine: (line: string) => void) {}

  push(chunk: string): void {
    this.pending += chunk;
    let end: number;
    while ((end = this.pending.indexOf("\n")) >= 0) {
      const line = this.pending.slice(0, end);
      this.pending = this.pending.slice(end + 1);
      if (line.trim()) this.onLine(line);
    }
  }
}

/** Newline-delimited JSON over a Unix socket. */
export class SocketTransport implements Transport {
  onMessage: (text: string) => void = () => {};
  onClose: (reason: string) => void = () => {};
  private closing?: Promise<void>;

  private constructor(private readonly socket: net.Socket) {
    const lines = new Lines((line) => this.onMessage(line));
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => lines.push(chunk));
    socket.on("close", () => this.onClose("the daemon closed the connection"));
    socket.on("error", () => {});
  }

  /** Connects to the socket at `path`, or fails with ConnectError within `timeoutMs`. */
  static connect(path: string, timeoutMs = 5000): Promise<SocketTransport> {
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new ConnectError(`no pyvisor daemon at ${path}: no answer within ${timeoutMs} ms`));
      }, timeoutMs);
      socket.once("connect", () => {
        clearTimeout(timer);
        resolve(new SocketTransport(socket));
      });
      socket.once("error", (err) => {
        clearTimeout(timer);
        reject(new ConnectError(`no pyvisor daemon at ${path}: ${err.message}`));
      });
    });
  }

  send(text: string): void {
    this.socket.write(text + "\n");
  }

  close(): Promise<void> {
    this.closing ??= new Promise((resolve) => {
      if (this.socket.destroyed) return resolve();
      this.socket.once("close", () => resolve());
      this.socket.end();
      this.socket.destroySoon();
    });
    return this.closing;
  }
}

/** Newline-delimited JSON with a child `pyvisor serve --stdio`, which ends with its stdin. */
export class ChildTransport implements Transport {
  onMessage: (text: string) => void = () => {};
  onClose: (reason: string) => void = () => {};
  private readonly exited: Promise<void>;

  private constructor(private readonly child: ChildProcess) {
    const lines = new Lines((line) => this.onMessage(line));
    child.stdout!.setEncoding("utf8");
    child.stdout!.on("data", (chunk: string) => lines.push(chunk));
    child.stdin!.on("error", () => {});
    this.exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => {
        this.onClose(`pyvisor serve --stdio exited (${signal ?? "code " + code})`);
        resolve();
      });
    });
  }

  /** Starts `binary serve --stdio` (with `args` after it) and waits until it answers. */
  static async start(binary: string, args: string[], env?: NodeJS.ProcessEnv, stderr: "inherit" | "ignore" = "ignore"): Promise<ChildTransport> {
    const child = spawn(binary, ["serve", "--stdio", ...args], {
      stdio: ["pipe", "pipe", stderr],
      env: env ?? process.env,
    });
    await new Promise<void>((resolve, reject) => {
      child.once("spawn", () => resolve());
      child.once("error", (err) => reject(new ConnectError(`start ${binary} serve --stdio: ${err.message}`)));
    });
    return new ChildTransport(child);
  }

  send(text: string): void {
    this.child.stdin!.write(text + "\n");
  }

  /** Ends the child's stdin: the daemon finishes what runs and exits. */
  close(): Promise<void> {
    this.child.stdin!.end();
    return this.exited;
  }
}

/** One session's WebSocket: JSON-RPC messages as text frames. */
export class WebSocketTransport implements Transport {
  onMessage: (text: string) => void = () => {};
  onClose: (reason: string) => void = () => {};
  private readonly closed: Promise<void>;

  private constructor(private readonly socket: WebSocketClient) {
    let ended: () => void = () => {};
    this.closed = new Promise((resolve) => (ended = resolve));
    socket.onMessage = (text) => this.onMessage(text);
    socket.onClose = (reason) => {
      this.onClose(reason);
      ended();
    };
  }

  static async open(url: string, headers: Record<string, string>): Promise<WebSocketTransport> {
    return new WebSocketTransport(await WebSocketClient.open(url, headers));
  }

  send(text: string): void {
    this.socket.send(text);
  }

  close(): Promise<void> {
    this.socket.close();
    return this.closed;
  }
}
