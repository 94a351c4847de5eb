"""Restores: the namespace brought back to a checkpoint.

A restore request carries the checkpoint's "index" (as the checkpoint reported it) and its
"groups": [{"token", "names", "path"}], each group's blob file. A group that this worker holds
unchanged since it last wrote or restored it (same token, and versions finds no change) is
kept as it is, not read again: going back to a checkpoint after one column of a frame was
dropped reloads that frame alone. With "clear", every other name (not the dunder ones) is
removed first, but for the session's definitions whose source is the one the checkpoint has.
Then the imports, the sources (run in the namespace, in the order they were first defined) and
the other groups are restored, in that order. A name whose restore fails is tried again after
the others as long as that brings something more back (a class body may use a value), then
reported in "lost"; "error" is set only when the request itself is unusable. Restored
definitions keep their source, for later checkpoints and for inspect.

restore_done: "restored" names, "kept" names (left as they were), "lost" and "error".
"""

import linecache
import os

from pyvisor_worker import blobfiles, checkpoints, pickling, state, versions

_restore_count = 0  # restored sources are compiled as <restored-N>


def restore(request):
    """Serve a restore request: bring the namespace back to the checkpoint it describes."""
    restore_id, index, groups = request.get("id"), request.get("index"), request.get("groups")
    reply = {"type": "restore_done", "id": restore_id, "restored": [], "kept": [], "lost": [],
             "error": None}
    problem = _check(index, groups)
    if problem is not None:
        return dict(reply, error="cannot restore: " + problem)
    touched = versions.take_touched()
    live = {record["token"]: record for record in state.checkpoint_records}
    kept, load = [], []
    for group in groups:
        record = checkpoints.unchanged(live.get(group["token"]), group["names"],
                                       state.namespace, touched) if _bound(group) else None
        if record is not None and record["names"] == group["names"]:
            kept.append(record)
        else:
            load.append(group)
    kept_names = {name for record in kept for name in record["names"]}
    sources = {name: (kind, source) for name, kind, source in index["sources"]}
    same_definitions = {
        name for name, (kind, source, _) in pickling.live_definitions().items()
        if sources.get(name) == (kind, source)
    }
    if request.get("clear"):
        keep = kept_names | same_definitions
        for name in [name for name in state.namespace if state.is_user_name(name)]:
            if name not in keep:
                del state.namespace[name]
        for name in [name for name in state.definitions if name not in same_definitions]:
            del state.definitions[name]
    # (names, function that restores them, its arguments), in the order of restoring
    pending = [([name], _restore_import, (name, module)) for name, module in index["imports"]]
    pending += [
        ([name], _restore_source, (name, kind, source))
        for name, kind, source in index["sources"] if name not in same_definitions
    ]
    pending += [(group["names"], _restore_group, (group,)) for group in load]
    records, restored, lost = list(kept), reply["restored"], {}
    while pending:  # again and again, while names come back: one may need another
        failed = []
        for names, restorer, args in pending:
            try:
                record = restorer(*args)
            except BaseException as exc:  # the session's code may raise anything
                failed.append((names, restorer, args))
                for name in names:
                    lost[name] = pickling.lost(name, exc)
            else:
                if record is not None:
                    records.append(record)
                restored.extend(names)
                for name in names:
                    lost.pop(name, None)
        if len(failed) == len(pending):
            break
        pending = failed
    state.checkpoint_records = records
    reply["kept"] = sorted(kept_names | same_definitions)
    reply["lost"] = list(lost.values())
    return reply


def _check(index, groups):
    """Why the index and groups of a request are unusable, or None."""
    if not isinstance(index, dict) or index.get("format") != checkpoints.INDEX_FORMAT:
        return "the checkpoint's index is not of format %d" % checkpoints.INDEX_FORMAT
    if not isinstance(groups, list):
        return "no list of groups"
    for group in groups:
        if not (isinstance(group, dict) and isinstance(group.get("token"), str)
                and isinstance(group.get("path"), str) and isinstance(group.get("names"), list)
                and all(isinstance(name, str) for name in group["names"])):
            return "a group is malformed: %r" % (group,)
    try:
        for name, module in index["imports"]:
            str(name), str(module)
        for name, kind, source in index["sources"]:
            str(name), str(kind), str(source)
    except (KeyError, TypeError, ValueError):
        return "the checkpoint's index is malformed"
    return None


def _bound(group):
    """Whether every name of `group` is bound in the namespace."""
    return all(name in state.namespace for name in group["names"])


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


def _restore_group(group):
    """Restore the values of a group from its blob file; returns its record."""
    names = group["names"]
    values = blobfiles.read(group["path"])
    if len(values) != len(names):
        raise ValueError("the blob holds %d values for %d names" % (len(values), len(names)))
    for name, value in zip(names, values):
        state.namespace[name] = value
    size = os.path.getsize(group["path"])
    return checkpoints.record_of(group["token"], names, state.namespace, size)
