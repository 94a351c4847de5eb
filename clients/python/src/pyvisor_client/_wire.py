"""The JSON-RPC both socket clients speak, without any I/O: where the daemon's socket is, the
request lines, what a line from the daemon is, the params of the methods, and what a
streamed notification asks of the caller's callbacks.

Framing is one JSON object per line, ``\\n``-terminated, UTF-8 (docs/protocol.md). The
daemon refuses a line over ``server.max_request_bytes`` (16 MiB by default) with an error
that carries no id, so the client refuses such a request itself.
"""

import itertools
import json
import os
import threading
from collections import namedtuple

from .errors import ConnectionClosed, LimitExceeded, ProtocolError, error_for

MAX_REQUEST_BYTES = 16 * 1024 * 1024

# One line from the daemon: a response (id, result, error) or a notification (method, params).
Message = namedtuple("Message", "id method params result error")

# What a waiting call gets instead of a Message when the connection ends.
CLOSED = object()


def default_socket():
    """``$PYVISOR_SOCKET``, else ``$XDG_RUNTIME_DIR/pyvisor/pyvisor.sock``, else
    ``~/.pyvisor/pyvisor.sock``: where the CLI looks for the daemon too."""
    explicit = os.environ.get("PYVISOR_SOCKET")
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "pyvisor", "pyvisor.sock")
    return os.path.join(os.path.expanduser("~"), ".pyvisor", "pyvisor.sock")


class Requests:
    """Numbers requests and encodes them as lines."""

    def __init__(self):
        self._ids = itertools.count(1)

    def encode(self, method, params=None):
        """(id, line) of a request; raises LimitExceeded for a line the daemon would refuse."""
        request_id = next(self._ids)
        message = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        line = json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"
        if len(line) > MAX_REQUEST_BYTES:
            raise LimitExceeded("request of %d bytes is over the daemon's limit of %d bytes"
                                % (len(line), MAX_REQUEST_BYTES))
        return request_id, line


def decode(line):
    """The Message of one line from the daemon; its error (if any) as a typed exception."""
    try:
        obj = json.loads(line)
    except ValueError as err:
        raise ProtocolError("the daemon sent a line that is not JSON: %s" % err) from None
    if not isinstance(obj, dict):
        raise ProtocolError("the daemon sent %s, not a JSON-RPC object" % type(obj).__name__)
    error = obj.get("error")
    if isinstance(error, dict):
        error = error_for(error.get("code"), error.get("message", ""), error.get("data"))
    return Message(obj.get("id"), obj.get("method"), obj.get("params") or {},
                   obj.get("result"), error)


def drop_none(**params):
    """The params that are set."""
    return {name: value for name, value in params.items() if value is not None}


def execute_params(session_id, code, timeout, stream, options):
    """The params of ``session.execute``; `options` are its other params (transaction, queue,
    cache, meta), None when not set."""
    params = drop_none(session_id=session_id, code=code, timeout_s=timeout, **options)
    if stream:
        params["stream"] = True
    return params


class Callbacks:
    """What the caller of one execution wants done with its streamed notifications, and
    who answers its code's LLM calls (``on_llm``, in a session created with
    ``llm="client"``)."""

    def __init__(self, on_stdout=None, on_stderr=None, on_display=None, on_input=None,
                 on_llm=None):
        self.on_output = {"stdout": on_stdout, "stderr": on_stderr}
        self.on_display = on_display
        self.on_input = on_input
        self.on_llm = on_llm

    @property
    def streaming(self):
        """Whether any callback is set, so the execution must stream."""
        return (any(self.on_output.values()) or self.on_display or self.on_input
                or self.on_llm)

    def call(self, message):
        """Calls the callback of a notification; what it returned (an awaitable from a
        coroutine function), None for a notification without a callback.

        An input request's callback is the caller's on_input, whose answer (a string, or None
        for EOFError) the client sends (see input_reply); without on_input it is None.
        """
        handler = self._handler(message)
        if handler is None:
            return None
        callback, args = handler
        return callback(*args)

    def _handler(self, message):
        """(callback, args) for a notification, or None for one without a callback."""
        from .results import Display

        params = message.params
        if message.method == "session.output":
            callback = self.on_output.get(params.get("stream"))
            return (callback, (params.get("data", ""),)) if callback else None
        if message.method == "session.display":
            if self.on_display is None:
                return None
            return self.on_display, (Display(params.get("mime", ""), params.get("data", "")),)
        if message.method == "session.input_request":
            answer = self.on_input or _no_answer
            return answer, (params.get("prompt", ""), bool(params.get("password")))
        return None


def input_reply(message, value):
    """The params of the ``session.input`` that answers `message` with `value`, or None when
    `message` is not an input request."""
    if message.method != "session.input_request":
        return None
    return {"session_id": message.params.get("session_id"),
            "execution_id": message.params.get("execution_id"), "value": value}


def _no_answer(prompt, password):
    """The answer to input() when the caller gave no on_input: EOFError in the code."""
    return None


class Routes:
    """Where each message from the daemon goes: a response to whoever waits for its id, a
    notification to the streaming execution of its session. The clients guard it with
    their own lock (a thread lock, or the event loop)."""

    def __init__(self):
        self.pending = {}  # request id -> what waits for its response
        self.streams = {}  # session id -> what gets its streaming execution's messages
        self.llm_calls = {}  # call id -> the LlmCall an on_llm answers now
        self.closed = None  # why the connection ended, once it has

    def target(self, message):
        """What waits for `message`, or None (a late answer, an unrouted notification or
        request of the daemon)."""
        if message.id is not None and message.method is None:
            return self.pending.pop(message.id, None)
        return self.streams.get(message.params.get("session_id"))

    def answering(self, message):
        """The LlmCall of the ``bridge.llm`` `message`, noted until ``answered``."""
        call = LlmCall(message.params)
        self.llm_calls[message.id] = call
        return call

    def answered(self, call_id):
        self.llm_calls.pop(call_id, None)

    def cancel(self, message):
        """Whether `message` is a ``bridge.cancel``; if so, the call it names is cancelled
        (a call already answered is not there any more)."""
        if message.method != "bridge.cancel":
            return False
        call = self.llm_calls.pop(message.params.get("call_id"), None)
        if call is not None:
            call.cancel()
        return True

    def close(self, reason):
        """Marks the connection ended; everything still waiting, to be given CLOSED."""
        self.closed = reason
        for call in self.llm_calls.values():
            call.cancel()  # nobody can take their answers any more
        self.llm_calls.clear()
        waiting = list(self.pending.values()) + list(self.streams.values())
        self.pending.clear()
        return waiting


class LlmCall(dict):
    """What ``on_llm`` gets: the ``bridge.llm`` params (``kind``, ``prompts``, ``depth``,
    ``model``, ``context``, ``session_id``, ``execution_id``, ``call_id``), and
    ``cancelled``, a ``threading.Event`` set when nobody waits for the answer any more (the
    execution was interrupted or timed out, the daemon gave up on the call, or the connection
    ended): a long on_llm may check it and stop early; its answer would be ignored."""

    def __init__(self, params):
        super().__init__(params)
        self.cancelled = threading.Event()
        self.on_cancel = None  # what else stops the answering (the asyncio client's task)

    def cancel(self):
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel()


def is_llm_call(message):
    """Whether `message` is the daemon's ``bridge.llm`` request, which the client answers."""
    return message.method == "bridge.llm" and message.id is not None


def llm_reply(message, answered=None, failure=None):
    """The line that answers the ``bridge.llm`` `message`: with what on_llm `answered` (a
    string, a list of strings, or a dict ``{answers, usage}``), or with `failure` (an
    exception or a reason), which raises LlmError in the session's code."""
    if failure is None and isinstance(answered, str):
        answered = {"answers": [answered]}
    elif failure is None and isinstance(answered, (list, tuple)):
        answered = {"answers": list(answered)}
    elif failure is None and not isinstance(answered, dict):
        failure = "on_llm returned %s, not answers" % type(answered).__name__
    reply = {"jsonrpc": "2.0", "id": message.id}
    if failure is None:
        reply["result"] = answered
    else:
        reply["error"] = {"code": -32000, "message": str(failure) or type(failure).__name__}
    return json.dumps(reply, ensure_ascii=False).encode("utf-8") + b"\n"


def no_llm_reply(message):
    """The answer to a ``bridge.llm`` that no running ``run(on_llm=...)`` of this client takes."""
    return llm_reply(message, failure="the client that ran this code has no on_llm")


def answer(message, request_id):
    """The result of the response `message` to `request_id`, or its error raised."""
    if message is CLOSED:
        raise ConnectionClosed("the connection ended before the answer to request %s"
                               % request_id)
    if message.error is not None:
        raise message.error
    return message.result


def fork_facts(forked):
    """What every clone of one ``session.fork`` shares: its duration and the threads that
    did not survive it."""
    return {"duration_ms": forked["duration_ms"], "threads": forked.get("threads", 0)}


class SessionBase:
    """What the sync and async sessions share: the client, the id, and the params."""

    def __init__(self, client, session_id, created=None):
        self._client = client
        self.session_id = session_id
        # What session.create answered (pid, python_version, warm, attached, restored).
        self.created = created or {}

    def __repr__(self):
        return "%s(%r)" % (type(self).__name__, self.session_id)

    def _params(self, **params):
        return dict(params, session_id=self.session_id)
