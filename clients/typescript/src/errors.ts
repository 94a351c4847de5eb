/**
 * The errors of the client: one class per JSON-RPC error code of the daemon
 * (docs/protocol.md, "Errors"), all `RpcError`, and the transport's own (`ConnectError`,
 * `ConnectionClosed`, `ProtocolError`). Every class derives from `PyvisorError`.
 */

/** Any error of this package. */
export class PyvisorError extends Error {
  override name = "PyvisorError";
}

/** No daemon answered where the client looked, or a child could not be started. */
export class ConnectError extends PyvisorError {
  override name = "ConnectError";
}

/** The connection ended while a call waited for its answer. */
export class ConnectionClosed extends PyvisorError {
  override name = "ConnectionClosed";
}

/** The daemon sent something that is not JSON-RPC. */
export class ProtocolError extends PyvisorError {
  override name = "ProtocolError";
}

/** A sandbox call that could not be done: a name that is not a Python name, a value JSON
 * cannot carry, an unbound name. */
export class SandboxError extends PyvisorError {
  override name = "SandboxError";
}

/** An error response of the daemon: its `code`, `message` and `data`. */
export class RpcError extends PyvisorError {
  override name = "RpcError";
  constructor(
    readonly code: number,
    message: string,
    readonly data?: unknown,
  ) {
    super(message);
  }
}

export class ParseError extends RpcError {
  override name = "ParseError";
}
export class InvalidRequest extends RpcError {
  override name = "InvalidRequest";
}
export class MethodNotFound extends RpcError {
  override name = "MethodNotFound";
}
export class InvalidParams extends RpcError {
  override name = "InvalidParams";
}
export class InternalError extends RpcError {
  override name = "InternalError";
}
export class EngineError extends RpcError {
  override name = "EngineError";
}
export class UnknownSession extends RpcError {
  override name = "UnknownSession";
}
export class PoolExhausted extends RpcError {
  override name = "PoolExhausted";
}
export class SessionBusy extends RpcError {
  override name = "SessionBusy";
}
export class CheckpointNotFound extends RpcError {
  override name = "CheckpointNotFound";
}
export class LimitExceeded extends RpcError {
  override name = "LimitExceeded";
}
export class ShuttingDown extends RpcError {
  override name = "ShuttingDown";
}
export class Unauthorized extends RpcError {
  override name = "Unauthorized";
}

const BY_CODE: Record<number, typeof RpcError> = {
  [-32700]: ParseError,
  [-32600]: InvalidRequest,
  [-32601]: MethodNotFound,
  [-32602]: InvalidParams,
  [-32603]: InternalError,
  [-32000]: EngineError,
  [-32001]: UnknownSession,
  [-32002]: PoolExhausted,
  [-32003]: SessionBusy,
  [-32004]: CheckpointNotFound,
  [-32005]: LimitExceeded,
  [-32006]: ShuttingDown,
  [-32007]: Unauthorized,
};

/** The typed error of a JSON-RPC error object. */
export function errorFor(error: { code?: unknown; message?: unknown; data?: unknown }): RpcError {
  const code = typeof error.code === "number" ? error.code : -32603;
  const message = typeof error.message === "string" ? error.message : "error " + code;
  const Class = BY_CODE[code] ?? RpcError;
  return new Class(code, message, error.data);
}
