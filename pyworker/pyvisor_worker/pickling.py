"""The pickler of checkpoints, and how a name that cannot be saved is reported.

Values are pickled, protocol 5, by cloudpickle or else dill when one of them can be imported,
else by pickle. The session's definitions (functions, classes and lambdas kept as source) are
pickled by reference, as getattr(__main__, name), so that an instance of a session class
restores as an instance of the restored class; modules are pickled as imports.
"""

import sys
import types

from pyvisor_worker import execution, state

REASON_LIMIT = 1024  # longest "reason" of a lost name, in bytes

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


def session_pickler(definitions):
    """(name, factory) of the pickler of values: factory(file, buffer_callback) pickles to
    `file`, protocol 5, handing out-of-band buffers to `buffer_callback`. It pickles the
    session's `definitions` by reference and modules as imports."""
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

    def factory(file, buffer_callback):
        return SessionPickler(file, protocol=5, buffer_callback=buffer_callback)

    return name, factory


def lost(name, exc):
    """A "lost" entry: `name`, and the reason that `exc` (an exception or a text) gives."""
    if isinstance(exc, BaseException):
        try:
            exc = "%s: %s" % (type(exc).__name__, exc)
        except Exception:
            exc = type(exc).__name__
    return {"name": name, "reason": execution.clip(exc, REASON_LIMIT)}


def live_definitions():
    """The session's definitions still bound to their name: name -> (kind, source, value)."""
    return {
        name: record for name, record in list(state.definitions.items())
        if state.namespace.get(name, state.MISSING) is record[2]
    }
