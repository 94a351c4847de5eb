"""The asyncio client over the daemon's Unix socket: AsyncClient and AsyncSession, the
coroutine twins of Client and Session.

A reader task routes each response to the future of its request and the notifications of a
streaming execution to the task that runs it, which calls the callbacks (plain functions or
coroutine functions). As in the sync client, one streaming execution per session runs on a
connection at a time.
"""

import asyncio
import inspect

from . import _files, _wire
from .errors import ConnectError, ConnectionClosed, ProtocolError, UnknownSession
from .results import ExecutionResult

class AsyncSession(_wire.SessionBase):
    """One session of the daemon, reached through an AsyncClient."""

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        try:
            await self.close()
        except (UnknownSession, ConnectionClosed):
            pass  # closed already, or the daemon went away: nothing is left to close

    async def run(self, code, timeout=None, on_stdout=None, on_stderr=None, on_display=None,
                  on_input=None, on_llm=None, **options):
        """As ``Session.run``; callbacks may be coroutine functions (``on_llm`` calls run
        as tasks of their own)."""
        callbacks = _wire.Callbacks(on_stdout, on_stderr, on_display, on_input, on_llm)
        params = _wire.execute_params(self.session_id, code, timeout, callbacks.streaming,
                                      options)
        if callbacks.streaming:
            answer = await self._client._stream_execute(params, callbacks)
        else:
            answer = await self._client.call("session.execute", params)
        return ExecutionResult.from_json(answer)

    async def send_input(self, execution_id, value):
        await self._call("session.input", execution_id=execution_id, value=value)

    async def interrupt(self):
        return (await self._call("session.interrupt"))["interrupted"]

    async def checkpoint(self):
        return await self._call("session.checkpoint")

    async def restore(self, checkpoint_id=None):
        params = {"checkpoint_id": checkpoint_id} if checkpoint_id is not None else {}
        return await self._call("session.restore", **params)

    async def checkpoints(self):
        return await self._call("session.checkpoints")

    async def info(self):
        return await self._call("session.info")

    async def hint(self, code):
        return (await self._call("session.hint", code=list(code)))["accepted"]

    async def close(self, checkpoint=False):
        await self._call("session.close", checkpoint=bool(checkpoint))

    async def fork(self, count=None, names=None):
        """As ``Session.fork``: a list of AsyncSession."""
        forked = await self._call("session.fork", **_wire.drop_none(
            count=count, names=list(names) if names is not None else None))
        return [AsyncSession(self._client, clone["session_id"],
                             dict(clone, **_wire.fork_facts(forked)))
                for clone in forked["sessions"]]

    @property
    def files(self):
        """The files of the session's work directory, as coroutines (see ``Session.files``)."""
        return _files.AsyncFiles(self)

    async def _call(self, method, **params):
        return await self._client.call(method, self._params(**params))


class AsyncClient:
    """A connection to the daemon's Unix socket; ``await AsyncClient.connect(path)``."""

    def __init__(self, path, reader, writer):
        self.path = path
        self._reader_stream = reader
        self._writer = writer
        self._requests = _wire.Requests()
        self._routes = _wire.Routes()  # of futures (responses) and queues (streams)
        self._stream_locks = {}  # session id -> lock held by its streaming execution
        self._answering = set()  # the on_llm tasks still running
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, path=None, connect_timeout=5.0):
        path = path or _wire.default_socket()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(path, limit=_wire.MAX_REQUEST_BYTES * 2),
                connect_timeout)
        except (OSError, asyncio.TimeoutError) as err:
            raise ConnectError("no pyvisor daemon at %s: %s" % (path, err)) from None
        return cls(path, reader, writer)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self):
        """Closes the connection; calls still waiting raise ConnectionClosed."""
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass
        await self._reader

    async def call(self, method, params=None):
        """Calls `method` and returns its result; raises the RpcError of its error code."""
        answer = asyncio.get_running_loop().create_future()
        request_id = await self._send(method, params, answer)
        return _wire.answer(await answer, request_id)

    async def create_session(self, name=None, owner=None, python=None, cwd=None, env=None,
                             limits=None, proactive=None, network=None, llm=None):
        created = await self.call("session.create", _wire.drop_none(
            name=name, owner=owner, python=python, cwd=cwd, env=env, limits=limits,
            proactive=proactive, network=network, llm=llm))
        return AsyncSession(self, created["session_id"], created)

    async def session(self, key):
        info = await self.call("session.info", {"session_id": key})
        return AsyncSession(self, info["session_id"])

    async def list_sessions(self, owner=None):
        return await self.call("session.list", _wire.drop_none(owner=owner))

    async def stats(self):
        return await self.call("engine.stats")

    async def health(self):
        return await self.call("engine.health")

    async def _send(self, method, params, target):
        if self._routes.closed is not None:
            raise ConnectionClosed(self._routes.closed)
        request_id, line = self._requests.encode(method, params)
        self._routes.pending[request_id] = target
        try:
            self._writer.write(line)
            await self._writer.drain()
        except OSError as err:
            self._routes.pending.pop(request_id, None)
            raise ConnectionClosed("the connection to the daemon failed: %s" % err) from None
        return request_id

    async def _stream_execute(self, params, callbacks):
        session_id = params["session_id"]
        lock = self._stream_locks.setdefault(session_id, asyncio.Lock())
        async with lock:
            messages = asyncio.Queue()
            self._routes.streams[session_id] = messages
            try:
                request_id = await self._send("session.execute", params, messages)
                while True:
                    message = await messages.get()
                    if message is _wire.CLOSED or (message.id == request_id
                                                   and message.method is None):
                        return _wire.answer(message, request_id)
                    if _wire.is_llm_call(message):
                        self._answer_llm(message, callbacks.on_llm)
                        continue
                    answer = callbacks.call(message)
                    if inspect.isawaitable(answer):
                        answer = await answer
                    reply = _wire.input_reply(message, answer)
                    if reply is not None:
                        await self.call("session.input", reply)
            finally:
                self._routes.streams.pop(session_id, None)

    def _answer_llm(self, message, on_llm):
        """Answers a ``bridge.llm`` with `on_llm`, on a task of its own, which a
        ``bridge.cancel`` of the call cancels (``call.cancelled`` is set as well)."""
        async def answer():
            try:
                answered = on_llm(call)
                if inspect.isawaitable(answered):
                    answered = await answered
                line = _wire.llm_reply(message, answered)
            except Exception as err:  # the code gets LlmError with the reason
                line = _wire.llm_reply(message, failure=err)
            finally:
                self._routes.answered(message.id)
            if not call.cancelled.is_set():
                self._write(line)

        if on_llm is None:
            return self._write(_wire.no_llm_reply(message))
        call = self._routes.answering(message)
        task = asyncio.get_running_loop().create_task(answer())
        call.on_cancel = task.cancel
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    def _write(self, line):
        """Writes one line, if the connection is still up."""
        if self._routes.closed is None:
            self._writer.write(line)

    async def _read(self):
        reason = "the daemon closed the connection"
        try:
            while True:
                line = await self._reader_stream.readline()
                if not line:
                    break
                message = _wire.decode(line)
                if self._routes.cancel(message):
                    continue
                target = self._routes.target(message)
                if target is None and _wire.is_llm_call(message):
                    self._write(_wire.no_llm_reply(message))
                _deliver(target, message)
        except (OSError, ValueError) as err:
            reason = "the connection to the daemon failed: %s" % err
        except ProtocolError as err:
            reason = str(err)
        for target in self._routes.close(reason):
            _deliver(target, _wire.CLOSED)


def _deliver(target, message):
    """Hands `message` to the future or queue that waits for it."""
    if target is None:
        return
    if isinstance(target, asyncio.Queue):
        target.put_nowait(message)
    elif not target.done():
        target.set_result(message)
