/**
 * pyvisor from Node.js: persistent Python sessions of a pyvisor daemon, whose code's
 * `llm_query` the Node program can answer.
 *
 * ```ts
 * import { connect } from "pyvisor";
 * await using client = await connect();               // the daemon's socket, else a child
 * await using session = await client.createSession({ llm: "client" });
 * const result = await session.run("llm_query('hi')", { onLlm: (call) => "hello" });
 * ```
 */

export { connect, defaultSocket, HttpClient, RpcClient } from "./client.js";
export type { Backend, Client, ConnectOptions } from "./client.js";
export { Session } from "./session.js";
export { CHUNK_BYTES, SessionFiles } from "./files.js";
export type { FileData } from "./files.js";
export { PyvisorSandbox } from "./sandbox.js";
export type { SandboxOptions, SandboxResult } from "./sandbox.js";
export * from "./errors.js";
export type * from "./types.js";
