"""The exceptions of the client: one class per JSON-RPC error code of the daemon, the
transport's own failures, and the failures of an execution that a caller asks to raise.

``error_for(code, message, data)`` turns an error object of the daemon (JSON-RPC over the
socket, or the ``{"error": {...}}`` body of an HTTP answer) into the class of its code.
"""


class PyvisorError(Exception):
    """Anything the client raises."""


class ConnectError(PyvisorError):
    """No daemon answered at the socket or URL."""


class ConnectionClosed(PyvisorError):
    """The connection ended while a call waited for its answer."""


class ProtocolError(PyvisorError):
    """The daemon sent something that is not the JSON-RPC the client speaks."""


class RpcError(PyvisorError):
    """An error object from the daemon; `code` is its JSON-RPC code."""

    code = None

    def __init__(self, message, code=None, data=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.data = data

    def __str__(self):
        return "%s (code %s)" % (self.message, self.code)


class ParseError(RpcError):
    code = -32700


class InvalidRequest(RpcError):
    code = -32600


class MethodNotFound(RpcError):
    code = -32601


class InvalidParams(RpcError):
    """A param is missing, of the wrong type or out of bounds; the message names it."""

    code = -32602


class InternalError(RpcError):
    code = -32603


class EngineError(RpcError):
    """An engine failure with no more specific code (a worker that would not start)."""

    code = -32000


class UnknownSession(RpcError):
    """No such session, or one of another owner."""

    code = -32001


class PoolExhausted(RpcError):
    """No worker could be had within the pool's acquire timeout."""

    code = -32002


class SessionBusy(RpcError):
    """Another execution runs and the call asked not to queue."""

    code = -32003


class CheckpointNotFound(RpcError):
    """No such checkpoint, or checkpoints are off."""

    code = -32004


class LimitExceeded(RpcError):
    """A request, an output, a checkpoint or an owner's sessions over their limit."""

    code = -32005


class ShuttingDown(RpcError):
    """The daemon is stopping and takes no new work."""

    code = -32006


class Unauthorized(RpcError):
    """A missing or wrong token, or an owner the caller may not act for."""

    code = -32007


_BY_CODE = {
    cls.code: cls
    for cls in (ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
                EngineError, UnknownSession, PoolExhausted, SessionBusy, CheckpointNotFound,
                LimitExceeded, ShuttingDown, Unauthorized)
}


def error_for(code, message, data=None):
    """The exception for an error object of the daemon: the class of its code, else RpcError."""
    cls = _BY_CODE.get(code, RpcError)
    return cls(message, code=code, data=data)


class ExecutionError(PyvisorError):
    """An execution that did not end ``ok``, raised by ``ExecutionResult.raise_for_status``."""

    def __init__(self, result):
        error = result.error or {}
        detail = "%s: %s" % (error.get("type"), error.get("message")) if error else ""
        super().__init__("execution %s ended %s%s" % (
            result.execution_id, result.status, " (%s)" % detail if detail else ""))
        self.result = result


class PythonError(ExecutionError):
    """The code raised an exception (status ``error``)."""


class ExecutionTimeout(ExecutionError):
    """The code ran past its timeout and was interrupted (status ``timeout``)."""


class ExecutionInterrupted(ExecutionError):
    """The code was interrupted (status ``interrupted``)."""


class WorkerCrashed(ExecutionError):
    """The worker died; ``result.recovered`` says what the session came back from."""


EXECUTION_ERRORS = {
    "error": PythonError,
    "timeout": ExecutionTimeout,
    "interrupted": ExecutionInterrupted,
    "crashed": WorkerCrashed,
}
