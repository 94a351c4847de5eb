"""What a snippet leaves inside the objects it reads, taken back before the next one runs.

The snippets of a speculation run one after another in one forked child (see speculation),
and code that only reads still leaves traces in objects: pandas memoises derived values in an
object's ``_cache`` (a label lookup builds an index's hash table, which a frame's memory usage
then counts), a ``functools.cached_property`` stores its value in the instance's ``__dict__``.
A later snippet would answer from those traces, although the session never ran the earlier
one.

``Guard(values)``, made before a snippet runs, notes the objects reachable from the values of
the names it reads: each object's attribute names, and the contents of each pandas ``_cache``.
``Guard.restore()``, after the run, puts every pandas ``_cache`` back as it was, drops the
values cached properties stored, and says whether the child is still a faithful copy of the
session: no attribute added or removed anywhere in those objects, no package imported (a
submodule of one already imported, as libraries import on first use, is allowed; an import
that wrote a warning ends the child by that), the warnings filters as they were, and every object within reach (at most MAX_OBJECTS objects,
MAX_ITEMS items of a container, MAX_DEPTH levels). When it is not, the speculation ends after
that snippet (the host plans the rest again, in a new child). When it is, the objects are as
the guard noted them, so the next snippet that reads exactly the same objects is guarded by the
same notes (``watches``) rather than by a new walk.

Only what is reachable from the names read is seen. A library's own module-level memo is not,
nor is anything the content fingerprints already cover (values; see fingerprints).
"""

import functools
import inspect
import sys
import types
import warnings

MAX_OBJECTS = 2000  # objects with attributes or items looked at, per snippet
MAX_ITEMS = 256  # items of one container looked at
MAX_DEPTH = 8  # levels below a name's value

_LEAVES = (int, float, complex, bool, type(None), str, bytes, bytearray, types.ModuleType, type,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, range, slice)
_CONTAINERS = (list, tuple, dict, set, frozenset)
_SLOTS = ("axes", "blocks", "values")  # C-level attributes of pandas's internals that hold data
_slots_of = {}  # type -> the names of _SLOTS it has as C-level attributes


class Guard:
    """The objects reachable from `values`, as they are now (see the module docstring)."""

    __slots__ = ("_values", "_shape", "_caches", "_uncached", "_whole", "_world")

    def __init__(self, values):
        self._values = list(values)
        self._caches = []  # (pandas object, a copy of its _cache)
        self._uncached = []  # pandas objects with an instance dict and no _cache
        self._shape, self._whole = _walk(self._values, self._caches, self._uncached)
        self._world = _world()

    def watches(self, values):
        """Whether this guard was made for exactly the objects `values` (a list)."""
        return len(values) == len(self._values) and all(
            value is watched for value, watched in zip(values, self._values))

    def restore(self):
        """Put back the caches, drop cached properties; whether nothing else changed. False
        also when an object's own code raised on the way: what was not put back stays."""
        try:
            return self._restore()
        except Exception:
            return False

    def _restore(self):
        for owner, cache in self._caches:
            current = _instance_dict(owner).get("_cache")
            if isinstance(current, dict):
                current.clear()
                current.update(cache)
            else:  # a copy: the noted cache must outlive the next snippet too
                _instance_dict(owner)["_cache"] = dict(cache)
        for owner in self._uncached:
            _instance_dict(owner).pop("_cache", None)
        for owner, names in self._shape.values():
            attributes = _instance_dict(owner)
            if attributes is None:
                continue
            for name in set(attributes) - names:
                if isinstance(getattr(type(owner), name, None), functools.cached_property):
                    del attributes[name]
        shape, whole = _walk(self._values, [], [])
        modules, filters = self._world
        return (self._whole and whole and _world()[1] == filters and _lazy_imports(modules)
                and _names(shape) == _names(self._shape))


def _walk(values, caches, uncached):
    """({id: (object, frozenset of its attribute names, None for an object without an
    instance dict)}, whether all was seen);
    fills `caches` and `uncached` with the pandas objects' caches."""
    shape = {}
    try:
        return shape, _visit(values, shape, caches, uncached)
    except Exception:  # an object's own code (a container's __len__, __iter__) raised
        return shape, False


def _visit(values, shape, caches, uncached):
    whole = True
    pending = [(value, 0) for value in values]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, _LEAVES) or id(value) in shape:
            continue
        if len(shape) >= MAX_OBJECTS or depth > MAX_DEPTH:
            whole = False
            break
        if isinstance(value, _CONTAINERS):
            if len(value) > MAX_ITEMS:
                whole = False
                break
            own = _instance_dict(value)  # a subclass's (pandas's FrozenList) or None
            shape[id(value)] = (value, None if own is None else frozenset(own))
            items = dict.values(value) if isinstance(value, dict) else value
            pending.extend((item, depth + 1) for item in items)
            continue
        pandas = type(value).__module__.startswith("pandas")
        if pandas:
            pending.extend((item, depth + 1) for item in _held_in_slots(value))
        attributes = _instance_dict(value)
        if attributes is None:
            continue
        shape[id(value)] = (value, frozenset(attributes))
        if pandas:
            cache = attributes.get("_cache")
            if isinstance(cache, dict):
                caches.append((value, dict(cache)))
            elif "_cache" not in attributes:
                uncached.append(value)
        pending.extend((item, depth + 1) for name, item in attributes.items()
                       if name != "_cache")
    return whole


def _held_in_slots(value):
    """What a pandas object holds outside its instance dict: a block manager's axes and
    blocks and a block's values live in C-level slots."""
    kind = type(value)
    names = _slots_of.get(kind)
    if names is None:
        names = _slots_of[kind] = [name for name in _SLOTS if isinstance(
            inspect.getattr_static(kind, name, None),
            (types.GetSetDescriptorType, types.MemberDescriptorType))]
    return [getattr(value, name) for name in names]


def _names(shape):
    return {key: names for key, (_, names) in shape.items()}


def _instance_dict(value):
    """`value`'s own attribute dict, or None; never runs the object's own code."""
    try:
        attributes = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return None
    return attributes if type(attributes) is dict else None


def _world():
    """What outside the objects a snippet can change and a later one would notice: the
    modules imported, the warnings filters."""
    return frozenset(sys.modules), (id(warnings.filters), len(warnings.filters))


def _lazy_imports(modules):
    """Whether the modules imported since `modules` were at most a library's own submodules,
    imported on first use (pandas imports its HTML formatter the first time a frame is
    shown): a package the session had not imported might change what later code does."""
    now = sys.modules.keys()
    return not modules - now and all(name.partition(".")[0] in modules
                                     for name in now - modules)
