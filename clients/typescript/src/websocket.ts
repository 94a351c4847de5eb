/**
 * A WebSocket client (RFC 6455) over `node:http` and `node:https`, enough for the daemon's
 * `GET /v1/sessions/{id}/ws`: text messages both ways, fragmented messages, ping and pong,
 * close. Node 20 has no stable WebSocket client of its own, and this keeps the package free
 * of runtime dependencies.
 */

import { createHash, randomBytes } from "node:crypto";
import * as http from "node:http";
import * as https from "node:https";
import type { Socket } from "node:net";

import { ConnectError, errorFor } from "./errors.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

enum Op {
  Continuation = 0x0,
  Text = 0x1,
  Binary = 0x2,
  Close = 0x8,
  Ping = 0x9,
  Pong = 0xa,
}

/** An open WebSocket: `send` text, `onMessage` and `onClose` hooks, `close`. */
export class WebSocketClient {
  onMessage: (text: string) => void = () => {};
  onClose: (reason: string) => void = () => {};
  private buffer: Buffer = Buffer.alloc(0);
  private fragments: Buffer[] = [];
  private closed = false;

  private constructor(private readonly socket: Socket) {
    socket.setNoDelay(true);
    socket.on("data", (chunk: Buffer) => this.receive(chunk));
    socket.on("close", () => this.end("the WebSocket closed"));
    socket.on("error", (err) => this.end("the WebSocket failed: " + err.message));
  }

  /** Opens `url` (`ws://` or `wss://`) with `headers`; a refusal is a typed error. */
  static open(url: string, headers: Record<string, string>): Promise<WebSocketClient> {
    const target = new URL(url);
    const secure = target.protocol === "wss:";
    const key = randomBytes(16).toString("base64");
    const request = (secure ? https : http).request({
      hostname: target.hostname,
      port: target.port || (secure ? 443 : 80),
      path: target.pathname + target.search,
      headers: {
        ...headers,
        Connection: "Upgrade",
        Upgrade: "websocket",
        "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Version": "13",
      },
    });
    return new Promise((resolve, reject) => {
      request.on("upgrade", (response, socket: Socket, head: Buffer) => {
        const expected = createHash("sha1").update(key + GUID).digest("base64");
        if (response.headers["sec-websocket-accept"] !== expected) {
          socket.destroy();
          return reject(new ConnectError("the server answered the WebSocket handshake wrongly"));
        }
        const client = new WebSocketClient(socket);
        if (head.length > 0) client.receive(head);
        resolve(client);
      });
      request.on("response", (response) => {
        let body = "";
        response.setEncoding("utf8");
        response.on("data", (chunk: string) => (body += chunk));
        response.on("end", () => reject(refusal(response.statusCode ?? 0, body)));
      });
      request.on("error", (err) => reject(new ConnectError(`no pyvisor daemon at ${url}: ${err.message}`)));
      request.end();
    });
  }

  /** Sends one text message. */
  send(text: string): void {
    if (!this.closed) this.socket.write(frame(Op.Text, Buffer.from(text, "utf8")));
  }

  /** Sends a close frame and ends the socket. */
  close(): void {
    if (this.closed) return;
    this.socket.write(frame(Op.Close, Buffer.from([0x03, 0xe8])));
    this.socket.end();
    this.end("the client closed the WebSocket");
  }

  private end(reason: string): void {
    if (this.closed) return;
    this.closed = true;
    this.socket.destroy();
    this.onClose(reason);
  }

  private receive(chunk: Buffer): void {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk;
    for (;;) {
      const parsed = parseFrame(this.buffer);
      if (parsed === undefined) return;
      this.buffer = this.buffer.subarray(parsed.length);
      this.handle(parsed.fin, parsed.op, parsed.payload);
    }
  }

  private handle(fin: boolean, op: number, payload: Buffer): void {
    switch (op) {
      case Op.Text:
      case Op.Binary:
      case Op.Continuation:
        this.fragments.push(payload);
        if (fin) {
          const message = Buffer.concat(this.fragments).toString("utf8");
          this.fragments = [];
          this.onMessage(message);
        }
        return;
      case Op.Ping:
        if (!this.closed) this.socket.write(frame(Op.Pong, payload));
        return;
      case Op.Close:
        this.end("the server closed the WebSocket");
        return;
      default:
        return;
    }
  }
}

/** A refused upgrade as the error of the daemon's `{error: {code, message}}` body. */
function refusal(status: number, body: string): Error {
  try {
    const parsed = JSON.parse(body) as { error?: { code?: number; message?: string } };
    if (parsed.error) return errorFor(parsed.error);
  } catch {
    // not JSON: say the status
  }
  return new ConnectError(`the WebSocket was refused with HTTP ${status}: ${body.slice(0, 200)}`);
}

/** A masked frame of a client. */
function frame(op: Op, payload: Buffer): Buffer {
  const length = payload.length;
  const extra = length < 126 ? 0 : length < 65536 ? 2 : 8;
  const header = Buffer.alloc(2 + extra + 4);
  header[0] = 0x80 | op;
  if (extra === 0) header[1] = 0x80 | length;
  else if (extra === 2) {
    header[1] = 0x80 | 126;
    header.writeUInt16BE(length, 2);
  } else {
    header[1] = 0x80 | 127;
    header.writeBigUInt64BE(BigInt(length), 2);
  }
  const mask = randomBytes(4);
  mask.copy(header, 2 + extra);
  const masked = Buffer.alloc(length);
  for (let i = 0; i < length; i++) masked[i] = payload[i]! ^ mask[i & 3]!;
  return Buffer.concat([header, masked]);
}

/** The first frame of `buffer`, or undefined when it is not all there yet. */
function parseFrame(buffer: Buffer): { fin: boolean; op: number; payload: Buffer; length: number } | undefined {
  if (buffer.length < 2) return undefined;
  const fin = (buffer[0]! & 0x80) !== 0;
  const op = buffer[0]! & 0x0f;
  const masked = (buffer[1]! & 0x80) !== 0;
  let length = buffer[1]! & 0x7f;
  let offset = 2;
  if (length === 126) {
    if (buffer.length < 4) return undefined;
    length = buffer.readUInt16BE(2);
    offset = 4;
  } else if (length === 127) {
    if (buffer.length < 10) return undefined;
    length = Number(buffer.readBigUInt64BE(2));
    offset = 10;
  }
  const maskAt = offset;
  if (masked) offset += 4;
  if (buffer.length < offset + length) return undefined;
  let payload = buffer.subarray(offset, offset + length);
  if (masked) {
    const mask = buffer.subarray(maskAt, maskAt + 4);
    payload = Buffer.from(payload.map((byte, i) => byte ^ mask[i & 3]!));
  }
  return { fin, op, payload, length: offset + length };
}
