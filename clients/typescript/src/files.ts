/**
 * `session.files`: the files of a session's work directory (docs/protocol.md
 * `session.files.*`). Paths are relative to it; `..`, absolute paths and symlinks that lead
 * out reject with `InvalidParams`, a file over `limits.file_bytes` or a full
 * `limits.disk_mb` with `LimitExceeded`, another owner's session with `UnknownSession`.
 *
 * Over JSON-RPC (the socket, a child, a session's WebSocket) the bytes travel as base64: a
 * write goes in chunks of `CHUNK_BYTES` (the first replaces the file, the others append) and
 * a read in ranges, so no message nears the daemon's request limit. A session of the HTTP
 * client reads and writes through the streamed routes instead (`GET`, with a `Range` for a
 * part, and `PUT`), so a large file is never held whole; an append still goes over its
 * WebSocket, since HTTP has no append route, and so does a path with a `.` or `..` component,
 * which a URL would resolve away. `upload` and `download` stream on either.
 */

import type { Connection } from "./connection.js";
import { ConnectError, errorFor, InvalidParams, PyvisorError } from "./errors.js";
import type { FileEntry } from "./types.js";

/** Bytes per `session.files.write` call and per read range: their base64 stays well under
 * the daemon's 16 MiB request limit. */
export const CHUNK_BYTES = 4 * 1024 * 1024;

/** Where a session of the HTTP client reaches its file routes. */
export interface FileRoutes {
  /** `http://host:port/v1/sessions/{id}/files`. */
  base: string;
  headers: Record<string, string>;
}

/** What a file's bytes may be given as: `string` is written as UTF-8. */
export type FileData = Uint8Array | string;

/** The files of one session. */
export class SessionFiles {
  constructor(
    private readonly connection: Connection,
    private readonly sessionId: string,
    private readonly routes?: FileRoutes,
  ) {}

  /** Writes `data` to `path` (appends with `append`), creating the directories on the way;
   * the file's size after. */
  async write(path: string, data: FileData, options: { append?: boolean } = {}): Promise<number> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    if (this.overHttp(path) && !options.append) return this.put(path, bytes);
    return this.writeOverRpc(path, [bytes], options.append === true);
  }

  /** Writes what `source` yields to `path`, holding at most one chunk of it at a time; the
   * file's size after. A refused or broken upload over HTTP leaves nothing; over JSON-RPC
   * the chunks written before the failure stay. */
  async upload(path: string, source: AsyncIterable<Uint8Array> | Iterable<Uint8Array>): Promise<number> {
    if (this.overHttp(path)) return this.put(path, streamOf(source));
    return this.writeOverRpc(path, source, false);
  }

  /** The bytes of `path` from `offset` (0): `length` of them, or to the end. */
  async read(path: string, options: { offset?: number; length?: number } = {}): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    for await (const part of this.download(path, options)) parts.push(part);
    return Buffer.concat(parts);
  }

  /** The bytes of `path` from `offset` (0), `length` of them or to the end, as they arrive. */
  async *download(path: string, options: { offset?: number; length?: number } = {}): AsyncGenerator<Uint8Array> {
    const offset = options.offset ?? 0;
    const length = options.length;
    // Checked here: a Range header of a negative number would be malformed, and the daemon
    // answers a malformed Range with the whole file.
    for (const [name, value] of [["offset", offset], ["length", length]] as const) {
      if (value !== undefined && !(Number.isSafeInteger(value) && value >= 0)) {
        throw new InvalidParams(-32602, `invalid params: ${name}: a whole number of bytes, at least 0, got ${value}`);
      }
    }
    if (this.overHttp(path)) {
      yield* this.get(path, offset, length);
      return;
    }
    let got = 0;
    while (length === undefined || got < length) {
      const params: Record<string, unknown> = { session_id: this.sessionId, path, offset: offset + got };
      params.length = length === undefined ? CHUNK_BYTES : Math.min(length - got, CHUNK_BYTES);
      const answer = await this.connection.call<{ data: string; eof: boolean }>("session.files.read", params);
      const data = Buffer.from(answer.data, "base64");
      got += data.length;
      if (data.length > 0) yield data;
      if (answer.eof || data.length === 0) return;
    }
  }

  /** The files and directories of `dir` (the work directory when absent), by name;
   * symlinks, sockets and devices are not listed. */
  list(dir?: string): Promise<FileEntry[]> {
    const params: Record<string, unknown> = { session_id: this.sessionId };
    if (dir !== undefined) params.path = dir;
    return this.connection.call<FileEntry[]>("session.files.list", params);
  }

  /** Removes the file, symlink (not its target) or empty directory `path`. */
  async remove(path: string): Promise<void> {
    await this.connection.call("session.files.remove", { session_id: this.sessionId, path });
  }

  private async writeOverRpc(
    path: string,
    source: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
    append: boolean,
  ): Promise<number> {
    let size: number | undefined;
    let calls = 0;
    const send = async (chunk: Uint8Array) => {
      const answer = await this.connection.call<{ size: number }>("session.files.write", {
        session_id: this.sessionId,
        path,
        data: Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).toString("base64"),
        append: append || calls > 0,
      });
      calls += 1;
      size = answer.size;
    };
    let pending: Uint8Array[] = [];
    let pendingBytes = 0;
    for await (const piece of source) {
      let rest = piece;
      while (pendingBytes + rest.length >= CHUNK_BYTES) {
        const take = CHUNK_BYTES - pendingBytes;
        await send(Buffer.concat([...pending, rest.subarray(0, take)]));
        rest = rest.subarray(take);
        pending = [];
        pendingBytes = 0;
      }
      if (rest.length > 0) {
        pending.push(rest);
        pendingBytes += rest.length;
      }
    }
    // The last chunk, or the one call that makes an empty file.
    if (pendingBytes > 0 || calls === 0) await send(Buffer.concat(pending));
    return size!;
  }

  /** Whether `path` goes through the HTTP routes: a session of the HTTP client, and a path
   * a URL carries as it is (a URL resolves `.` and `..` segments away, so such a path goes
   * over JSON-RPC, where the daemon refuses it as it should). */
  private overHttp(path: string): boolean {
    return this.routes !== undefined && !path.split("/").some((part) => part === "." || part === "..");
  }

  private fileUrl(path: string): string {
    const encoded = path.split("/").map(encodeURIComponent).join("/");
    return `${this.routes!.base}/${encoded}`;
  }

  /** `PUT` of `body` to `path`; the file's size after. */
  private async put(path: string, body: Uint8Array | ReadableStream<Uint8Array>): Promise<number> {
    const response = await this.fetch(path, {
      method: "PUT",
      headers: { ...this.routes!.headers, "Content-Type": "application/octet-stream" },
      body,
      // A stream body needs it (Node's fetch sends it as it is read).
      duplex: "half",
    } as RequestInit);
    const answer = (await response.json()) as { size: number };
    return answer.size;
  }

  /** `GET` of `path`, with a `Range` when only a part is asked for. */
  private async *get(path: string, offset: number, length: number | undefined): AsyncGenerator<Uint8Array> {
    if (length === 0) return;
    const headers: Record<string, string> = { ...this.routes!.headers };
    if (offset > 0 || length !== undefined) {
      headers.Range = `bytes=${offset}-${length === undefined ? "" : offset + length - 1}`;
    }
    const response = await this.fetch(path, { method: "GET", headers });
    if (response.status === 416 || !response.body) {
      await response.body?.cancel();
      return; // a range from past the end: nothing, as over JSON-RPC
    }
    for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) yield chunk;
  }

  /** One request to the file route of `path`; a failure rejects with its typed error (a 416,
   * a range from past the end, is answered). */
  private async fetch(path: string, init: RequestInit): Promise<Response> {
    let response: Response;
    try {
      response = await fetch(this.fileUrl(path), init);
    } catch (err) {
      throw new ConnectError(`${init.method} ${path}: ${err instanceof Error ? err.message : String(err)}`);
    }
    if (response.ok || response.status === 416) return response;
    const text = await response.text();
    let error: { code?: number; message?: string } | undefined;
    try {
      error = (JSON.parse(text) as { error?: { code?: number; message?: string } }).error;
    } catch {
      // not JSON: the status says it
    }
    throw error ? errorFor(error) : new PyvisorError(`HTTP ${response.status} from ${init.method} ${path}: ${text.slice(0, 200)}`);
  }
}

/** `source` as a web stream for a request body, pulled one piece at a time. */
function streamOf(source: AsyncIterable<Uint8Array> | Iterable<Uint8Array>): ReadableStream<Uint8Array> {
  const pieces =
    Symbol.asyncIterator in source ? source[Symbol.asyncIterator]() : (source as Iterable<Uint8Array>)[Symbol.iterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await pieces.next();
      if (next.done) controller.close();
      else controller.enqueue(next.value);
    },
    async cancel() {
      await pieces.return?.();
    },
  });
}
