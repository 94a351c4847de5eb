"""Checkpoints and restores: the namespace saved to a file, and loaded back from one.

Checkpoints save the namespace to the file at "path" (created with mode 0600), each name on its
own (two names that share an object restore as two objects), dunder names left out. A module
is saved as an import: ``import numpy as np`` restores as such, and so does ``from os import
path``. Functions, classes and lambdas that the session defined at the top level of a cell
(``def``, ``async def`` and ``class`` statements with their decorators, ``name = lambda ...``
assignments) and that are still bound to their name are saved as their source, and run again on
restore, so that they restore even when pickle cannot take them. Any other value is pickled,
protocol 5, by cloudpickle or else dill when one of them can be imported, else by pickle; the
session's definitions in it are pickled by reference, so that an instance of a session class
restores as an instance of the restored class. A name that cannot be saved (an open socket, a
generator) is reported in "lost" with the reason; "error" is set only when no file could be
written. With "background": true the worker forks, and the child writes the file from its
copy-on-write copy of the namespace while the worker goes on serving: checkpoint_done comes when
the child is done, maybe after the results of later executions. The child writes nothing to fds
1, 2 and 4: it sends its report (the JSON of checkpoint_done's fields) to the worker through a
pipe. When fork() fails, or when the last checkpoint was at most 4 MiB (writing it at once takes
a few milliseconds, less than a child's copy-on-write faults cost), the checkpoint is written at
once, as without "background".

The file, which only the worker reads: 8 bytes b"PYVCKPT1"; for each pickled value, its pickle
stream followed by its out-of-band buffers (pickle protocol 5 buffers of 64 KiB or more, such as
numpy's and pandas' data) as raw bytes; the index, a pickle of {"format": 1, "pickler": name,
"imports": [(name, module)], "sources": [(name, kind, source)], "values": [(name, offset,
length, [buffer sizes])]}; and the index's offset as 8 bytes big-endian.

Restores: with "clear", the session's names (not the dunder ones) are removed first. Then the
imports, the sources (run in the namespace, in the order they were first defined) and the values
are restored, in that order. A name whose restore fails is tried again after the others as long
as that brings something more back (a class body may use a value), then reported in "lost";
"error" is set only when the file cannot be read at all. Restored definitions keep their source,
for later checkpoints and for inspect.
"""

import linecache
import os
import struct
import sys
import types

from pyvisor_worker import execution, protocol, state

_CHECKPOINT_MAGIC = b"PYVCKPT1"
_CHECKPOINT_FORMAT = 1
_TRAILER = struct.Struct(">Q")  # the offset of the index, at the end of the file
_OUT_OF_BAND_MIN = 64 * 1024  # smaller pickle buffers stay in the pickle stream
_REASON_LIMIT = 1024  # longest "reason" of a lost name, in bytes
_restore_count = 0  # restored sources are compiled as <restored-N>

# Checkpoints up to this size are written by the worker itself, larger ones by a forked child.
_INLINE_CHECKPOINT_BYTES = 4 * 1024 * 1024
# Size of the last checkpoint this worker wrote, None before the first.
_last_checkpoint_bytes = None


def checkpoint(request):
    """Serve a checkpoint request; None when a forked child writes it and a thread replies."""
    global _last_checkpoint_bytes
    checkpoint_id, path = request.get("id"), request.get("path")
    if not isinstance(path, str):
        raise TypeError("checkpoint request %r needs a path string" % (checkpoint_id,))
    pickler_base()  # imported here, not in every forked child
    # A small namespace is written faster at once than by a child, whose writes copy every
    # page it touches; the size of the last checkpoint tells which this one is likely to be.
    small = _last_checkpoint_bytes is not None and _last_checkpoint_bytes <= _INLINE_CHECKPOINT_BYTES
    if request.get("background") and not small and _checkpoint_in_child(checkpoint_id, path):
        return None
    report = _write_checkpoint(path)
    _last_checkpoint_bytes = report["bytes"]
    return checkpoint_done(checkpoint_id, report)


def checkpoint_done(checkpoint_id, report):
    """The checkpoint_done message of a report (bytes, saved, lost, error)."""
    return {"type": "checkpoint_done", "id": checkpoint_id, **report}


def no_checkpoint(error):
    """The report of a checkpoint that wrote no file."""
    return {"bytes": 0, "saved": [], "lost": [], "error": error}


def _lost(name, exc):
    """A "lost" entry: `name`, and the reason that `exc` (an exception or a text) gives."""
    if isinstance(exc, BaseException):
        try:
            exc = "%s: %s" % (type(exc).__name__, exc)
        except Exception:
            exc = type(exc).__name__
    return {"name": name, "reason": execution.clip(exc, _REASON_LIMIT)}


def _checkpoint_in_child(checkpoint_id, path):
    """Fork a child that writes the checkpoint from its copy of the namespace, and a thread that
    replies when the child is done; False when fork() fails."""
    try:
        report_read, report_write = os.pipe()
    except OSError:
        return False
    try:
        if sys.version_info < (3, 12):
            pid = os.fork()
        else:  # which warns of fork() in a process with threads, on the code's stderr
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
    except OSError:
        os.close(report_read)
        os.close(report_write)
        return False
    if pid == 0:
        os.close(report_read)
        _checkpoint_child(path, report_write)
    os.close(report_write)
    protocol.start_thread(_await_checkpoint_child, checkpoint_id, path, pid, report_read)
    return True


def _checkpoint_child(path, report_fd):
    """In the forked child: write the checkpoint, its report to `report_fd`, exit. Never returns.

    The child never writes a frame (the reader thread, which the child does not have, may have
    held the writer's lock at the fork), and nothing the session's code prints reaches the host.
    """
    status = 1
    try:
        for fd in (protocol.REQUEST_FD, protocol.REPLY_FD):
            os.close(fd)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        import gc

        gc.disable()  # collections would only copy the shared pages
        report = protocol.encode(_write_checkpoint(path)).encode("utf-8", "replace")
        with open(report_fd, "wb") as pipe:
            pipe.write(report)
        status = 0
    finally:
        os._exit(status)


def _await_checkpoint_child(checkpoint_id, path, pid, report_fd):
    """Thread: read the report of the checkpoint child `pid`, reap it, send checkpoint_done."""
    global _last_checkpoint_bytes
    try:
        with open(report_fd, "rb") as pipe:
            data = pipe.read()  # until the child exits
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # the session's code reaped it
            status = 0
        try:
            report = protocol.decode(data.decode("utf-8"))
        except ValueError:  # it died before its report was whole
            if os.WIFSIGNALED(status):
                how = "was killed by signal %d" % os.WTERMSIG(status)
            else:
                how = "exited with status %d" % os.WEXITSTATUS(status)
            _remove(path)  # what it wrote of it
            report = no_checkpoint("the process writing the checkpoint " + how)
    except BaseException as exc:
        report = no_checkpoint(execution.worker_error(exc)["message"])
    if report.get("error") is None:
        _last_checkpoint_bytes = report.get("bytes")
    protocol.send(checkpoint_done(checkpoint_id, report))


def _remove(path):
    """Remove the file `path` if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _live_definitions():
    """The session's definitions still bound to their name: name -> (kind, source, value)."""
    return {
        name: record for name, record in list(state.definitions.items())
        if state.namespace.get(name, state.MISSING) is record[2]
    }


def _write_checkpoint(path):
    """Save the namespace to the file `path`; the report of checkpoint_done."""
    import pickle

    definitions = _live_definitions()
    pickler_name, pickler = _session_pickler(definitions)
    sources = [(name, kind, source) for name, (kind, source, _) in definitions.items()]
    saved, lost, imports, values = list(definitions), [], [], []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return no_checkpoint("cannot create %s: %s" % (path, exc.strerror))
    try:
        with open(fd, "wb") as file:
            os.fchmod(fd, 0o600)
            file.write(_CHECKPOINT_MAGIC)
            for name, value in list(state.namespace.items()):
                if not state.is_user_name(name) or name in definitions:
                    continue
                if isinstance(value, types.ModuleType):
                    module = getattr(value, "__name__", None)
                    if isinstance(module, str) and sys.modules.get(module) is value:
                        imports.append((name, module))
                        saved.append(name)
                    else:
                        lost.append(_lost(name, "module %r is not importable by name" % module))
                    continue
                start = file.tell()
                buffers = []
                try:
                    pickler(file, buffers).dump(value)
                except BaseException as exc:  # the value's own code may raise anything
                    file.seek(start)
                    file.truncate()
                    lost.append(_lost(name, exc))
                    continue
                length = file.tell() - start
                for buffer in buffers:
                    file.write(buffer)
                values.append((name, start, length, [buffer.nbytes for buffer in buffers]))
                saved.append(name)
            index_at = file.tell()
            index = {
                "format": _CHECKPOINT_FORMAT,
                "pickler": pickler_name,
                "imports": imports,
                "sources": sources,
                "values": values,
            }
            pickle.dump(index, file, protocol=5)
            file.write(_TRAILER.pack(index_at))
            size = file.tell()
    except Exception as exc:
        _remove(path)
        return no_checkpoint("cannot write %s: %s: %s" % (path, type(exc).__name__, exc))
    return {"bytes": size, "saved": saved, "lost": lost, "error": None}


_pickler = None


def pickler_base():
    """(name, Pickler class): cloudpickle's or dill's when one imports, else pickle's.

    Imported once, in the worker itself: a forked checkpoint child that imported cloudpickle
    would pay the ~30 ms of that import at every checkpoint.
    """
    global _pickler
    if _pickler is None:
        import importlib
        import pickle

        _pickler = ("pickle", pickle.Pickler)
        for candidate in ("cloudpickle", "dill"):
            try:
                _pickler = (candidate, importlib.import_module(candidate).Pickler)
                break
            except Exception:
                pass
    return _pickler


def _session_pickler(definitions):
    """(name, factory) of the pickler of values: factory(file, buffers) pickles to `file`.

    It is cloudpickle's or dill's Pickler when one can be imported, else pickle's, protocol 5,
    putting out-of-band buffers of _OUT_OF_BAND_MIN bytes or more in the list `buffers`. It
    pickles the session's `definitions` by reference, as getattr(__main__, name), so that they
    restore as the objects that their restored source made, and modules as imports.
    """
    import importlib

    name, base = pickler_base()
    by_id = {id(value): (defined, value) for defined, (_, _, value) in definitions.items()}
    session = state.session

    class SessionPickler(base):
        def reducer_override(self, obj):
            found = by_id.get(id(obj))
            if found is not None and found[1] is obj:
                return getattr, (session, found[0])
            if isinstance(obj, types.ModuleType):
                module = getattr(obj, "__name__", None)
                if isinstance(module, str) and sys.modules.get(module) is obj:
                    return importlib.import_module, (module,)
            parent = getattr(super(), "reducer_override", None)
            return NotImplemented if parent is None else parent(obj)

    def out_of_band(buffers, buffer):
        """Keep a large contiguous buffer out of the stream; others stay in (return True)."""
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous
            return True
        if view.nbytes < _OUT_OF_BAND_MIN:
            return True
        buffers.append(view)
        return False

    def factory(file, buffers):
        return SessionPickler(file, protocol=5, buffer_callback=lambda b: out_of_band(buffers, b))

    return name, factory


def restore(request):
    """Serve a restore request: load the checkpoint file into the namespace."""
    import pickle

    restore_id, path, clear = request.get("id"), request.get("path"), request.get("clear")
    if not isinstance(path, str):
        raise TypeError("restore request %r needs a path string" % (restore_id,))
    reply = {"type": "restore_done", "id": restore_id, "restored": [], "lost": [], "error": None}
    try:
        file = open(path, "rb")
    except OSError as exc:
        return dict(reply, error="cannot open %s: %s" % (path, exc.strerror))
    with file:
        try:
            if file.read(len(_CHECKPOINT_MAGIC)) != _CHECKPOINT_MAGIC:
                raise ValueError("not a pyvisor worker checkpoint")
            file.seek(-_TRAILER.size, os.SEEK_END)
            (index_at,) = _TRAILER.unpack(file.read(_TRAILER.size))
            file.seek(index_at)
            index = pickle.load(file)
            if index.get("format") != _CHECKPOINT_FORMAT:
                raise ValueError("format %r, not %r" % (index.get("format"), _CHECKPOINT_FORMAT))
            # (name, function that restores it, its arguments), in the order of restoring
            pending = [(name, _restore_import, (module,)) for name, module in index["imports"]]
            pending += [
                (name, _restore_source, (kind, source)) for name, kind, source in index["sources"]
            ]
            pending += [
                (name, _restore_value, (file, *place)) for name, *place in index["values"]
            ]
        except Exception as exc:
            return dict(reply, error="cannot read %s: %s: %s" % (path, type(exc).__name__, exc))
        if clear:
            for name in [name for name in state.namespace if state.is_user_name(name)]:
                del state.namespace[name]
            state.definitions.clear()
        restored, lost = reply["restored"], {}
        while pending:  # again and again, while names come back: one may need another
            failed = []
            for name, restorer, args in pending:
                try:
                    restorer(name, *args)
                except BaseException as exc:  # the session's code may raise anything
                    failed.append((name, restorer, args))
                    lost[name] = _lost(name, exc)
                else:
                    restored.append(name)
                    lost.pop(name, None)
            if len(failed) == len(pending):
                break
            pending = failed
        reply["lost"] = list(lost.values())
    return reply


def _restore_import(name, module):
    """Restore a module saved as an import."""
    import importlib

    state.namespace[name] = importlib.import_module(module)


def _restore_source(name, kind, source):
    """Restore a definition saved as source: run it in the namespace."""
    global _restore_count
    _restore_count += 1
    filename = "<restored-%d>" % _restore_count
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec", dont_inherit=True), state.namespace)
    value = state.namespace[name]
    state.definitions.pop(name, None)
    state.definitions[name] = (kind, source, value)


def _restore_value(name, file, offset, length, buffer_sizes):
    """Restore a pickled value from the checkpoint `file`."""
    import pickle

    file.seek(offset)
    data = file.read(length)
    buffers = []
    for size in buffer_sizes:  # writable, so that numpy arrays made on them are
        buffer = bytearray(size)
        if file.readinto(buffer) != size:
            raise EOFError("the checkpoint file is cut short")
        buffers.append(buffer)
    state.namespace[name] = pickle.loads(data, buffers=buffers)
