"""Checkpoints: the namespace saved as blob files, one per group of names that changed.

A checkpoint request names a directory ("dir"), which the host created for it, and a limit
("max_bytes") on the state it may hold. The names of the namespace (dunder names left out) are
saved three ways. A module is saved as an import: ``import numpy as np`` restores as such, and
so does ``from os import path``. Functions, classes and lambdas that the session defined at the
top level of a cell (``def``, ``async def`` and ``class`` statements with their decorators,
``name = lambda ...`` assignments) and that are still bound to their name are saved as their
source, and run again on restore, so that they restore even when pickle cannot take them. Any
other value is pickled (see pickling), in groups: names that share objects go together (see
versions), one blob file per group (see blobfiles), named ``<token>.blob`` in "dir".

With "incremental", a group that has not changed since the checkpoint this worker last
reported (see versions) is not written again: the report names it with its earlier token and
no file, and the host points the new checkpoint at the blob it already has. A group that
cannot be pickled as a whole is pickled name by name (their sharing is then lost); a name that
cannot be saved at all (an open socket, a generator) is reported in "lost" with the reason.
"error" is set only when no checkpoint could be written: a state over "max_bytes" ("checkpoint
of at least N MB over the limit of M MB"), or a directory that cannot be written to.

The report, checkpoint_done: "bytes" written, "saved" and "lost" names, "error", the "index"
(JSON: {"format": 2, "pickler": name, "imports": [[name, module]], "sources": [[name, kind,
source]]}), which the host keeps and hands back to restore, and "groups": [{"token", "names",
"file" (null when unchanged), "bytes"}].

With "background": true the worker forks, and the child writes the files from its
copy-on-write copy of the namespace while the worker goes on serving: checkpoint_done comes when
the child is done, maybe after the results of later executions. The child writes nothing to fds
1, 2 and 4: it sends its report, with the record of its groups (see versions), to the worker
through a pipe. The worker first plans the checkpoint (groups and which are unchanged, which
takes about a millisecond for a 200 MB frame); when fork() fails, or when every group to
write had at most 4 MiB together last time (writing them at once takes a few milliseconds, less
than a fork of a large process and its copy-on-write faults), the checkpoint is written at
once, as without "background".
"""

import os
import sys
import types

from pyvisor_worker import blobfiles, execution, pickling, protocol, state, versions

INDEX_FORMAT = 2
# A checkpoint that writes at most this much (as far as the groups' last sizes tell) is written
# by the worker itself, a larger one by a forked child.
_INLINE_BYTES = 4 * 1024 * 1024


def checkpoint(request):
    """Serve a checkpoint request; None when a forked child writes it and a thread replies."""
    checkpoint_id, directory = request.get("id"), request.get("dir")
    max_bytes = request.get("max_bytes")
    if not isinstance(directory, str) or not isinstance(max_bytes, int):
        raise TypeError("checkpoint request %r needs a dir and max_bytes" % (checkpoint_id,))
    pickling.pickler_base()  # imported here, not in every forked child
    touched = versions.take_touched()
    base = state.checkpoint_records if request.get("incremental") else []
    plan = _Plan(base, touched)
    if request.get("background") and not plan.small():
        if _checkpoint_in_child(checkpoint_id, directory, plan, max_bytes):
            return None
    report = _write_checkpoint(directory, plan, max_bytes)
    return _reported(checkpoint_id, report, touched)


def checkpoint_done(checkpoint_id, report):
    """The checkpoint_done message of a report."""
    return {"type": "checkpoint_done", "id": checkpoint_id, **report}


def no_checkpoint(error):
    """The report of a checkpoint that wrote nothing."""
    return {"bytes": 0, "saved": [], "lost": [], "error": error}


def _reported(checkpoint_id, report, touched):
    """Adopt the records of a report (or give back what it took) and make its message."""
    records = report.pop("records", None)
    if report.get("error") is None and records is not None:
        state.checkpoint_records = records
    else:
        versions.give_back_touched(touched)
    return checkpoint_done(checkpoint_id, report)


def _checkpoint_in_child(checkpoint_id, directory, plan, max_bytes):
    """Fork a child that writes the checkpoint from its copy of the namespace, and a thread that
    replies when the child is done; False when fork() fails."""
    try:
        report_read, report_write = os.pipe()
    except OSError:
        return False
    try:
        pid = execution.fork()
    except OSError:
        os.close(report_read)
        os.close(report_write)
        return False
    if pid == 0:
        os.close(report_read)
        _checkpoint_child(directory, plan, max_bytes, report_write)
    os.close(report_write)
    protocol.start_thread(
        _await_checkpoint_child, checkpoint_id, directory, plan.touched, pid, report_read
    )
    return True


def _checkpoint_child(directory, plan, max_bytes, report_fd):
    """In the forked child: write the checkpoint, its report to `report_fd`, exit. Never returns.

    The child never writes a frame (the control thread, which the child does not have, may have
    held the writer's lock at the fork), and nothing the session's code prints reaches the host.
    """
    status = 1
    try:
        protocol.close_protocol_fds()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        import gc

        gc.disable()  # collections would only copy the shared pages
        report = _write_checkpoint(directory, plan, max_bytes)
        with open(report_fd, "wb") as pipe:
            pipe.write(protocol.encode(report).encode("utf-8", "replace"))
        status = 0
    finally:
        os._exit(status)


def _await_checkpoint_child(checkpoint_id, directory, touched, pid, report_fd):
    """Thread: read the report of the checkpoint child `pid`, reap it, send checkpoint_done."""
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
            _remove_blobs(directory)  # what it wrote of them
            report = no_checkpoint("the process writing the checkpoint " + how)
    except BaseException as exc:
        report = no_checkpoint(execution.worker_error(exc)["message"])
    protocol.send(_reported(checkpoint_id, report, touched))


class _Plan:
    """What a checkpoint saves and how: the definitions kept as source, the imports, the
    names that cannot be saved, and each group of values with its record when unchanged."""

    def __init__(self, base, touched):
        self.touched = touched
        self.definitions = pickling.live_definitions()
        self.saved = list(self.definitions)
        self.lost, self.imports, self.values = [], [], {}
        for name, value in list(state.namespace.items()):
            if not state.is_user_name(name) or name in self.definitions:
                continue
            if isinstance(value, types.ModuleType):
                module = getattr(value, "__name__", None)
                if isinstance(module, str) and sys.modules.get(module) is value:
                    self.imports.append([name, module])
                    self.saved.append(name)
                else:
                    reason = "module %r is not importable by name" % module
                    self.lost.append(pickling.lost(name, reason))
                continue
            self.values[name] = value
        previous = {tuple(record["names"]): record for record in base}
        # (names, record of the unchanged group or None, record of the group's last version)
        self.groups = []
        for names in versions.partition(self.values, touched):
            last = previous.get(tuple(names))
            self.groups.append((names, unchanged(last, names, self.values, touched), last))

    def small(self):
        """Whether every group to write has a last version, and together they were small."""
        to_write = 0
        for _, record, last in self.groups:
            if record is None:
                if last is None:
                    return False
                to_write += last["bytes"]
        return to_write <= _INLINE_BYTES


def _write_checkpoint(directory, plan, max_bytes):
    """Save the namespace as `plan` says, as blob files in `directory`: the report of
    checkpoint_done, with the records of its groups."""
    pickler_name, factory = pickling.session_pickler(plan.definitions)
    sources = [[name, kind, source] for name, (kind, source, _) in plan.definitions.items()]
    saved, lost, values = list(plan.saved), list(plan.lost), plan.values
    budget = blobfiles.Budget(max_bytes)
    groups, records, written = [], [], 0
    try:
        for names, record, _ in plan.groups:
            if record is not None:
                budget.spend(record["bytes"])
                groups.append({"token": record["token"], "names": names, "file": None,
                               "bytes": record["bytes"]})
                records.append(record)
                saved.extend(names)
                continue
            for token, kept, file, size in _write_group(directory, names, values, factory,
                                                        budget, lost):
                groups.append({"token": token, "names": kept, "file": file, "bytes": size})
                records.append(record_of(token, kept, values, size))
                saved.extend(kept)
                written += size
    except blobfiles.OverLimit as over:
        _remove_blobs(directory)
        return no_checkpoint("checkpoint of at least %s over the limit of %s (state.max_bytes, "
                             "by default the session's memory limit)"
                             % (_megabytes(over.written), _megabytes(over.limit)))
    except OSError as exc:
        _remove_blobs(directory)
        return no_checkpoint("cannot write the checkpoint to %s: %s" % (directory, exc))
    index = {"format": INDEX_FORMAT, "pickler": pickler_name, "imports": plan.imports,
             "sources": sources}
    return {"bytes": written, "saved": saved, "lost": lost, "error": None, "index": index,
            "groups": groups, "records": records}


def unchanged(record, names, values, touched):
    """`record`, when the group of `names` is as it recorded (see versions); else None."""
    if record is None or touched is None or record["bytes"] < versions.REUSE_MIN:
        return None
    if not touched.isdisjoint(names):
        return None
    if record["ids"] != [id(values[name]) for name in names]:
        return None
    if record["fingerprints"] != [versions.fingerprint(values[name]) for name in names]:
        return None
    return record


def record_of(token, names, values, size):
    """What the worker remembers of a group it wrote, to tell later whether it changed."""
    return {"token": token, "names": names, "bytes": size,
            "ids": [id(values[name]) for name in names],
            "fingerprints": [versions.fingerprint(values[name]) for name in names]}


def _write_group(directory, names, values, factory, budget, lost):
    """Write the group of `names` to a new blob file: [(token, names, file, bytes)], more than
    one when the group had to be split because a value could not be pickled."""
    token = versions.new_token()
    file = token + ".blob"
    path = os.path.join(directory, file)
    spent = budget.used
    try:
        size = blobfiles.write(path, [values[name] for name in names], factory, budget)
        return [(token, names, file, size)]
    except blobfiles.OverLimit:
        raise
    except OSError as exc:
        if not os.path.isdir(directory):
            raise
        failure = exc
    except BaseException as exc:  # the value's own code may raise anything
        failure = exc
    _remove(path)
    budget.used = spent
    if len(names) == 1:
        lost.append(pickling.lost(names[0], failure))
        return []
    written = []
    for name in names:  # which one cannot be pickled? The others are saved on their own.
        written += _write_group(directory, [name], values, factory, budget, lost)
    return written


def _remove_blobs(directory):
    """Remove the blob files a failed checkpoint left in `directory`."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(".blob"):
            _remove(os.path.join(directory, name))


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def _megabytes(size):
    return "%.1f MB" % (size / 1e6)
