"""The synchronous client over the daemon's Unix socket, and the Session that both it and
the HTTP client hand out.

One connection serves any number of threads: a reader thread routes each response to the
thread that waits for it, and the notifications of a streaming execution to the thread that
runs it, which calls the caller's callbacks (never the reader thread, so a callback may
make calls of its own, such as the ``session.input`` that answers ``input()``). As in the
Rust client, one streaming execution per session runs on a connection at a time: the
notifications carry an ``execution_id`` the caller learns only from the response, so they
are routed by session; a second streaming ``run`` of that session waits for the first.
"""

import queue
import socket
import threading
from contextlib import contextmanager

from . import _files, _wire
from .errors import ConnectError, ConnectionClosed, ProtocolError, UnknownSession
from .results import ExecutionResult

class Session(_wire.SessionBase):
    """One session of the daemon, reached through a client (socket or HTTP)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.close()
        except (UnknownSession, ConnectionClosed):
            pass  # closed already, or the daemon went away: nothing is left to close

    def run(self, code, timeout=None, on_stdout=None, on_stderr=None, on_display=None,
            on_input=None, on_llm=None, **options):
        """Runs `code`; its ExecutionResult, whatever its status (see raise_for_status).

        With any callback the execution streams: ``on_stdout(text)``/``on_stderr(text)`` get
        output as it is written, ``on_display(Display)`` rich output, and
        ``on_input(prompt, password)`` answers ``input()`` with a string (None: EOFError).
        In a session created with ``llm="client"``, ``on_llm(call)`` answers the code's
        ``llm_query`` and its kin: `call` is the ``bridge.llm`` params (``kind``,
        ``prompts``, ...) with ``call.cancelled``, a ``threading.Event`` set once nobody
        waits for the answer (the code was interrupted or timed out); it returns the answer
        (a string), the answers (a list, one per prompt) or ``{"answers": [...], "usage":
        {...}}``, or raises, which raises LlmError in the code. Each call runs on a thread
        of its own, so calls made at once are answered concurrently.
        `timeout` is in seconds; `options` are the other params of ``session.execute``
        (``transaction``, ``queue``, ``cache``, ``meta``).
        """
        callbacks = _wire.Callbacks(on_stdout, on_stderr, on_display, on_input, on_llm)
        params = _wire.execute_params(self.session_id, code, timeout, callbacks.streaming,
                                      options)
        if callbacks.streaming:
            answer = self._client._stream_execute(params, callbacks)
        else:
            answer = self._client.call("session.execute", params)
        return ExecutionResult.from_json(answer)

    def send_input(self, execution_id, value):
        """Answers the pending ``input()`` of `execution_id` (None: EOFError)."""
        self._call("session.input", execution_id=execution_id, value=value)

    def interrupt(self):
        """Raises KeyboardInterrupt in the running code; False when nothing ran."""
        return self._call("session.interrupt")["interrupted"]

    def checkpoint(self):
        """Saves the namespace now: {checkpoint_id, bytes, state_bytes, saved, lost, duration_ms}."""
        return self._call("session.checkpoint")

    def restore(self, checkpoint_id=None):
        """Brings the namespace back to a checkpoint (the latest when None)."""
        params = {"checkpoint_id": checkpoint_id} if checkpoint_id is not None else {}
        return self._call("session.restore", **params)

    def checkpoints(self):
        """The session's checkpoints, newest first."""
        return self._call("session.checkpoints")

    def info(self):
        """``session.info``: state, variables, definitions, durability, limits, sandbox."""
        return self._call("session.info")

    def hint(self, code):
        """Tells the engine the snippets `code` (a list) are likely next; how many it took."""
        return self._call("session.hint", code=list(code))["accepted"]

    def close(self, checkpoint=False):
        """Ends the session; with `checkpoint`, a last checkpoint keeps it on disk."""
        self._call("session.close", checkpoint=bool(checkpoint))

    def fork(self, count=None, names=None):
        """Clones of the session (``session.fork``): `count` of them (1 to 16; the number of
        `names` when given, else 1), each starting from the namespace as it is between
        executions, then independent. A list of Session; the answer is each one's
        ``created`` (``pid``, ``name``, and the fork's ``duration_ms`` and ``threads``)."""
        forked = self._call("session.fork", **_wire.drop_none(
            count=count, names=list(names) if names is not None else None))
        return [Session(self._client, clone["session_id"], dict(clone, **_wire.fork_facts(forked)))
                for clone in forked["sessions"]]

    @property
    def files(self):
        """The files of the session's work directory: ``write``, ``read``, ``list``,
        ``remove``."""
        return _files.Files(self)

    def _call(self, method, **params):
        return self._client.call(method, self._params(**params))


class _Sessions:
    """The methods every sync client has on top of ``call``."""

    def create_session(self, name=None, owner=None, python=None, cwd=None, env=None,
                       limits=None, proactive=None, network=None, llm=None):
        """A new session, or the live session `name` (then ``created["attached"]`` is true).
        `llm`: True for the engine's LLM bridge, ``"client"`` for calls ``run(on_llm=)``
        answers."""
        created = self.call("session.create", _wire.drop_none(
            name=name, owner=owner, python=python, cwd=cwd, env=env, limits=limits,
            proactive=proactive, network=network, llm=llm))
        return Session(self, created["session_id"], created)

    def session(self, key):
        """The live session whose id or name is `key` (UnknownSession when there is none)."""
        return Session(self, self.call("session.info", {"session_id": key})["session_id"])

    def list_sessions(self, owner=None):
        """``session.info`` of every session the caller may see (of `owner`, for an admin)."""
        return self.call("session.list", _wire.drop_none(owner=owner))

    def stats(self):
        return self.call("engine.stats")

    def _write_file(self, session_id, path, data, append):
        return _files.write_over_rpc(self.call, session_id, path, data, append)

    def _read_file(self, session_id, path, offset, length):
        return _files.read_over_rpc(self.call, session_id, path, offset, length)

    def health(self):
        return self.call("engine.health")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Client(_Sessions):
    """A connection to the daemon's Unix socket (`path`, else the default of the CLI)."""

    def __init__(self, path=None, connect_timeout=5.0):
        self.path = path or _wire.default_socket()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(connect_timeout)
        try:
            sock.connect(self.path)
        except OSError as err:
            sock.close()
            raise ConnectError("no pyvisor daemon at %s: %s" % (self.path, err)) from None
        sock.settimeout(None)
        self._attach(sock)

    @classmethod
    def over(cls, sock, label):
        """A client on `sock`, a connected stream socket (one end of a socketpair whose other
        end is the stdin and stdout of a ``pyvisor serve --stdio``); `label` names it in
        errors."""
        client = cls.__new__(cls)
        client.path = label
        client._attach(sock)
        return client

    def _attach(self, sock):
        self._sock = sock
        self._requests = _wire.Requests()
        self._lock = threading.Lock()  # guards the routes and the socket's writes
        self._routes = _wire.Routes()  # of queues
        self._stream_locks = {}  # session id -> lock held by its streaming execution
        self._reader = threading.Thread(target=self._read, name="pyvisor-client", daemon=True)
        self._reader.start()

    def call(self, method, params=None):
        """Calls `method` and returns its result; raises the RpcError of its error code."""
        answers = queue.Queue()
        request_id = self._send(method, params, answers)
        return _wire.answer(answers.get(), request_id)

    def close(self):
        """Closes the connection; calls still waiting raise ConnectionClosed."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.join()
        self._sock.close()

    def _send(self, method, params, answers):
        request_id, line = self._requests.encode(method, params)
        with self._lock:
            if self._routes.closed is not None:
                raise ConnectionClosed(self._routes.closed)
            self._routes.pending[request_id] = answers
            try:
                self._sock.sendall(line)
            except OSError as err:
                del self._routes.pending[request_id]
                raise ConnectionClosed("the connection to the daemon failed: %s" % err) from None
        return request_id

    def _stream_execute(self, params, callbacks):
        with self._streaming(params["session_id"]) as messages:
            request_id = self._send("session.execute", params, messages)
            while True:
                message = messages.get()
                if message is _wire.CLOSED or (message.id == request_id
                                               and message.method is None):
                    return _wire.answer(message, request_id)
                if _wire.is_llm_call(message):
                    self._answer_llm(message, callbacks.on_llm)
                    continue
                reply = _wire.input_reply(message, callbacks.call(message))
                if reply is not None:
                    self.call("session.input", reply)

    def _answer_llm(self, message, on_llm):
        """Answers a ``bridge.llm`` with `on_llm`, on a thread of its own."""
        def answer():
            try:
                line = _wire.llm_reply(message, on_llm(call))
            except Exception as err:  # the code gets LlmError with the reason
                line = _wire.llm_reply(message, failure=err)
            with self._lock:
                self._routes.answered(message.id)
            if not call.cancelled.is_set():
                self._write(line)

        if on_llm is None:
            return self._write(_wire.no_llm_reply(message))
        with self._lock:
            call = self._routes.answering(message)
        threading.Thread(target=answer, name="pyvisor-on-llm", daemon=True).start()

    def _write(self, line):
        """Writes one line, if the connection is still up."""
        with self._lock:
            if self._routes.closed is None:
                try:
                    self._sock.sendall(line)
                except OSError:
                    pass  # the reader sees the connection end

    @contextmanager
    def _streaming(self, session_id):
        """The queue that gets `session_id`'s notifications while this thread streams it."""
        with self._lock:
            lock = self._stream_locks.setdefault(session_id, threading.Lock())
        with lock:
            messages = queue.Queue()
            with self._lock:
                if self._routes.closed is not None:
                    raise ConnectionClosed(self._routes.closed)
                self._routes.streams[session_id] = messages
            try:
                yield messages
            finally:
                with self._lock:
                    self._routes.streams.pop(session_id, None)

    def _read(self):
        reason = "the daemon closed the connection"
        try:
            for line in self._sock.makefile("rb"):
                message = _wire.decode(line)
                with self._lock:
                    if self._routes.cancel(message):
                        continue
                    target = self._routes.target(message)
                if target is not None:
                    target.put(message)
                elif _wire.is_llm_call(message):
                    self._write(_wire.no_llm_reply(message))
        except (OSError, ValueError) as err:
            reason = "the connection to the daemon failed: %s" % err
        except ProtocolError as err:
            reason = str(err)
        with self._lock:
            waiting = self._routes.close(reason)
        for target in waiting:
            target.put(_wire.CLOSED)
