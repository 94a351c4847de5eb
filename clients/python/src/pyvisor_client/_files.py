"""``session.files``: the files of a session's work directory (``session.files.*`` of
docs/protocol.md), for the sync sessions (socket and HTTP) and the async one.

Over the socket the bytes travel as base64: a large write goes in chunks (the first
replaces the file, the others append) and a read in ranges, so no call nears the daemon's
request limit. Over HTTP a write is one streamed ``PUT`` and a read one ``GET``.
"""

import base64

# Bytes per write call: their base64 stays well under the daemon's 16 MiB request limit.
WRITE_CHUNK = 4 * 1024 * 1024


def as_bytes(data):
    """`data` as bytes: str is written as UTF-8."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def write_steps(session_id, path, data, append):
    """The calls of a write, as a generator: it yields the ``session.files.write`` params of
    each call (at least one), is sent each answer, and returns the file's size after."""
    size = None
    for start in range(0, max(len(data), 1), WRITE_CHUNK):
        answer = yield {"session_id": session_id, "path": path,
                        "data": base64.b64encode(data[start:start + WRITE_CHUNK]).decode("ascii"),
                        "append": append or start > 0}
        size = answer["size"]
    return size


def read_steps(session_id, path, offset, length):
    """The calls of a read, as a generator: it yields the ``session.files.read`` params of
    each range, is sent each answer, and returns the bytes (`length` of them, or to the end)."""
    parts = []
    got = 0
    while True:
        params = {"session_id": session_id, "path": path, "offset": offset + got}
        if length is not None:
            params["length"] = min(length - got, WRITE_CHUNK)
        answer = yield params
        data = base64.b64decode(answer["data"])
        parts.append(data)
        got += len(data)
        if answer["eof"] or not data or (length is not None and got >= length):
            return b"".join(parts)


def run_steps(steps, call, method):
    """Drives `steps` with the sync `call` of `method`; what the steps return."""
    try:
        params = next(steps)
        while True:
            params = steps.send(call(method, params))
    except StopIteration as done:
        return done.value


async def run_steps_async(steps, call, method):
    """``run_steps`` with a coroutine `call`."""
    try:
        params = next(steps)
        while True:
            params = steps.send(await call(method, params))
    except StopIteration as done:
        return done.value


def list_params(session_id, path):
    return {"session_id": session_id, "path": path} if path is not None \
        else {"session_id": session_id}


class Files:
    """The files of one session (sync): paths are relative to its work directory; ``..``,
    absolute paths and symlinks that lead out raise InvalidParams, a file over
    ``limits.file_bytes`` or a full ``limits.disk_mb`` LimitExceeded."""

    def __init__(self, session):
        self._session = session

    def write(self, path, data, append=False):
        """Writes `data` (bytes, or str as UTF-8) to `path`, creating the directories on the
        way; the file's size after."""
        return self._session._client._write_file(
            self._session.session_id, path, as_bytes(data), bool(append))

    def read(self, path, offset=0, length=None):
        """The bytes of `path` from `offset`: `length` of them, or to the end."""
        return self._session._client._read_file(self._session.session_id, path, offset, length)

    def list(self, path=None):
        """``[{name, type: "file"|"dir", size, mtime}]`` of the directory `path` (the work
        directory when None), by name."""
        return self._session._client.call(
            "session.files.list", list_params(self._session.session_id, path))

    def remove(self, path):
        """Removes the file (or empty directory) `path`."""
        self._session._client.call(
            "session.files.remove", {"session_id": self._session.session_id, "path": path})


def write_over_rpc(call, session_id, path, data, append):
    """A write through ``session.files.write`` calls; the file's size after."""
    return run_steps(write_steps(session_id, path, data, append), call, "session.files.write")


def read_over_rpc(call, session_id, path, offset, length):
    """A read through ``session.files.read`` ranges."""
    return run_steps(read_steps(session_id, path, offset, length), call, "session.files.read")


class AsyncFiles:
    """``Files`` for an AsyncSession: the same methods, as coroutines."""

    def __init__(self, session):
        self._session = session

    async def write(self, path, data, append=False):
        steps = write_steps(self._session.session_id, path, as_bytes(data), bool(append))
        return await run_steps_async(steps, self._session._client.call, "session.files.write")

    async def read(self, path, offset=0, length=None):
        steps = read_steps(self._session.session_id, path, offset, length)
        return await run_steps_async(steps, self._session._client.call, "session.files.read")

    async def list(self, path=None):
        return await self._session._client.call(
            "session.files.list", list_params(self._session.session_id, path))

    async def remove(self, path):
        await self._session._client.call(
            "session.files.remove", {"session_id": self._session.session_id, "path": path})
