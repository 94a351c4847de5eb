"""pyvisor_client: persistent Python sessions of a pyvisor daemon, from Python.

    from pyvisor_client import Client

    with Client() as client, client.create_session() as session:
        session.run("x = 6 * 7")
        print(session.run("x").value)        # 42

``Client`` speaks JSON-RPC over the daemon's Unix socket (streaming, input()),
``HttpClient`` the HTTP API, ``AsyncClient`` the socket under asyncio. Errors of the daemon
are raised as the RpcError subclass of their code (``UnknownSession``, ``InvalidParams``, ...);
an execution's own failure is in its result's ``status``, raised on request by
``ExecutionResult.raise_for_status()``. The protocol: docs/protocol.md of pyvisor.
"""

from ._wire import LlmCall, default_socket
from .aio import AsyncClient, AsyncSession
from .client import Client, Session
from .errors import (
    CheckpointNotFound, ConnectError, ConnectionClosed, EngineError, ExecutionError,
    ExecutionInterrupted, ExecutionTimeout, InternalError, InvalidParams, InvalidRequest,
    LimitExceeded, MethodNotFound, ParseError, PoolExhausted, ProtocolError, PyvisorError,
    PythonError, RpcError, SessionBusy, ShuttingDown, Unauthorized, UnknownSession,
    WorkerCrashed, error_for,
)
from .http import HttpClient
from .results import Display, ExecutionResult

__all__ = [
    "AsyncClient", "AsyncSession", "CheckpointNotFound", "Client", "ConnectError",
    "ConnectionClosed", "Display", "EngineError", "ExecutionError", "ExecutionInterrupted",
    "ExecutionResult", "ExecutionTimeout", "HttpClient", "InternalError", "InvalidParams",
    "InvalidRequest", "LimitExceeded", "LlmCall", "MethodNotFound", "ParseError", "PoolExhausted",
    "ProtocolError", "PyvisorError", "PythonError", "RpcError", "Session", "SessionBusy",
    "ShuttingDown", "Unauthorized", "UnknownSession", "WorkerCrashed", "default_socket",
    "error_for",
]
