"""Adopt: the host answers a request from the cache of a speculative run; check it may.

An adopt request ({"id", "code", "reads", "files", "ambient"}, the stamps of the speculative
run's outcome) is served on the main thread in order with executions. The answer is fresh when
every name read has a value of the same content fingerprint (or is still unbound, for a null
fingerprint), every file has the same stat stamp, and the ambient token is the same. A fresh
adopt counts as an execution of "code": the cell counter moves on and the code goes into
linecache under its ``<cell-N>``, so later tracebacks are numbered as if it had run.

Reply: {"type": "adopt_done", "id", "fresh": bool, "reason": null | "changed df" |
"changed /data/x.csv" | "changed the ambient"}.

A counted message ({"code"}) is what is left of an adopt when the host knows that nothing ran
since the speculative run forked (its answer read the namespace exactly as it is, and no
file): it only counts the execution, and has no reply.
"""

from pyvisor_worker import execution, fingerprints, quiet, state, surroundings


def adopt(request):
    """Serve an adopt request: its adopt_done message."""
    adopt_id, code = request.get("id"), request.get("code")
    reads, files = request.get("reads"), request.get("files")
    ambient = request.get("ambient")
    if (not isinstance(code, str) or not isinstance(ambient, str)
            or not isinstance(reads, list) or not isinstance(files, list)
            or not all(isinstance(stamp, dict) for stamp in reads + files)):
        raise TypeError("adopt request %r needs code, reads, files and ambient" % (adopt_id,))
    with quiet.quiet():
        reason = _stale(reads, files, ambient)
    if reason is None:
        execution.count_cell(code)
    return adopt_done(adopt_id, reason)


def counted(request):
    """Serve a counted message: the host answered its code from a speculative run on the
    namespace as it is, and only the count is left to do. No reply."""
    code = request.get("code")
    if not isinstance(code, str):
        raise TypeError("counted message needs code")
    execution.count_cell(code)


def adopt_done(adopt_id, reason):
    """The adopt_done message; fresh when there is no `reason`."""
    return {"type": "adopt_done", "id": adopt_id, "fresh": reason is None, "reason": reason}


def _stale(reads, files, ambient):
    """Why the stamps no longer hold, or None."""
    namespace = state.namespace
    for stamp in reads:
        name = stamp.get("name")
        value = namespace.get(name, state.MISSING)
        now = None if value is state.MISSING else fingerprints.content_fingerprint(value)
        if now != stamp.get("fingerprint"):
            return "changed %s" % (name,)
    for stamp in files:
        if surroundings.stamp_of(stamp.get("path")) != stamp:
            return "changed %s" % (stamp.get("path"),)
    if surroundings.ambient() != ambient:
        return "changed the ambient"
    return None
