"""What a checkpoint must write again: the groups of names, and which of them changed.

Groups. Names whose values share an object are pickled together, in one blob, so that the
sharing survives a restore (two names for one list, a frame and an object that holds it, an
array and a view of it). The objects a value holds are found by walking the object graph
(gc.get_referents) up to WALK_BUDGET objects per name; immutable atoms (numbers, strings,
bytes), modules, classes, functions and pandas Index objects (immutable, and shared by most
frames derived from one another) do not tie names together. A numpy array ties its name to
the array that owns its memory (its .base, to the root), so a view goes with its base.

Versions. A group is written again unless all of these hold since the checkpoint the worker
last reported: no cell could reach any of its names (state.touched: every name a cell
mentions, and the globals of the session's functions it calls, the names the transaction code
computes); each name is bound to the same object; each value has the same fingerprint; and the
group's blob was large enough (REUSE_MIN) for skipping it to matter. A fingerprint is cheap and
catches a change made through a path the tracking does not see (an alias inside a container,
``globals()``): for numpy arrays and pandas frames and series, their shape, dtypes, columns,
data addresses and a CRC of sampled bytes of their data; for containers, their length and the
identity of sampled items; for other objects, the identity of their attributes' values.
Not caught: an in-place change of array data that leaves every sampled byte alone, made
through a path that names none of the group's names.
"""

import gc
import hashlib
import itertools
import os
import sys
import time
import types
import zlib

from pyvisor_worker import state

WALK_BUDGET = 20_000  # objects visited per name when grouping
_CACHED_WALK = 1_000  # walks that found this many objects are remembered
REUSE_MIN = 64 * 1024  # smaller blobs are written again every time: cheaper than any doubt
_SAMPLES = 64  # sampled windows of an array's data in its fingerprint
_WINDOW = 256  # bytes per sampled window
_ITEMS = 8  # sampled items of a container in its fingerprint

_ATOMS = (
    type(None), bool, int, float, complex, str, bytes, range, type, types.ModuleType,
    types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType,
    type(Ellipsis), type(NotImplemented),
)

_token_count = 0


def new_token():
    """A name for a new version of a group, unique across workers and restarts."""
    global _token_count
    _token_count += 1
    return "%x-%x-%x" % (os.getpid(), time.time_ns(), _token_count)


def touch(names):
    """A cell could have changed the values of `names` (None: of any name)."""
    if names is None:
        state.touched_all = True
    else:
        state.touched.update(names)


def take_touched():
    """The names touched since the last call (None: any), which start over empty."""
    touched, every = state.touched, state.touched_all
    state.touched, state.touched_all = set(), False
    return None if every else touched


def give_back_touched(touched):
    """Put back names taken by take_touched() for a checkpoint that did not happen."""
    if touched is None:
        state.touched_all = True
    else:
        state.touched.update(touched)


def partition(values, touched):
    """Group the names of `values` ({name: value}) by shared objects, in namespace order.

    The objects a value holds are walked again only when its name was touched (`touched`,
    None for all) or rebound since the last walk; larger walks are remembered in
    state.identity_cache, so that a checkpoint after a small change does not walk a big
    container the change could not reach."""
    cache, fresh = state.identity_cache, {}
    parent = {name: name for name in values}

    def root(name):
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    owner = {}  # id of a shared object -> the first name found holding it
    for name, value in values.items():
        cached = cache.get(name)
        untouched = touched is not None and name not in touched
        if cached is not None and cached[0] == id(value) and untouched:
            identities = cached[1]
        else:
            identities = _identities(value)
        if len(identities) >= _CACHED_WALK:
            fresh[name] = (id(value), identities)
        for key in identities:
            first = owner.setdefault(key, name)
            if first != name:
                a, b = root(first), root(name)
                if a != b:
                    parent[b] = a
    state.identity_cache = fresh
    groups = {}
    for name in values:
        groups.setdefault(root(name), []).append(name)
    return list(groups.values())


def _identities(value):
    """The ids of the mutable objects `value` holds, itself included, within the budget."""
    found, pending = set(), [value]
    index_type = _pandas_type("Index")
    ndarray = _numpy_type()
    while pending and len(found) < WALK_BUDGET:
        obj = pending.pop()
        key = id(obj)
        if key in found or isinstance(obj, _ATOMS):
            continue
        if index_type is not None and isinstance(obj, index_type):
            continue
        found.add(key)
        if ndarray is not None and isinstance(obj, ndarray):
            base = obj
            while isinstance(getattr(base, "base", None), ndarray):
                base = base.base
            found.add(id(base))
            if base.base is not None:  # memory owned by another object (bytes, mmap)
                found.add(id(base.base))
            continue
        try:
            pending.extend(gc.get_referents(obj))
        except Exception:
            pass
    return found


def fingerprint(value):
    """A short text that changes when `value` changes in a way a checkpoint must see."""
    parts = [type(value).__module__, type(value).__qualname__]
    try:
        _describe(value, parts)
    except Exception:  # the value's own code may raise: then never reuse it
        parts.append(("unfingerprintable", new_token()))
    return hashlib.blake2b(repr(parts).encode("utf-8", "replace"), digest_size=16).hexdigest()


def _describe(value, parts):
    ndarray = _numpy_type()
    frame, series = _pandas_type("DataFrame"), _pandas_type("Series")
    if ndarray is not None and isinstance(value, ndarray):
        parts.append(_array_parts(value))
    elif (frame is not None and isinstance(value, frame)) or (
        series is not None and isinstance(value, series)
    ):
        dtypes = value.dtypes if isinstance(value, frame) else value.dtype
        parts.append((value.shape, repr(dtypes)[:10_000]))
        columns = getattr(value, "columns", None)
        if columns is not None:
            parts.append(tuple(map(repr, columns[:1000])))
        parts.append((id(value.index), len(value.index)))
        manager = getattr(value, "_mgr", None)
        for block in getattr(manager, "blocks", ()):
            data = getattr(block, "values", None)
            if ndarray is not None and isinstance(data, ndarray):
                parts.append(_array_parts(data))
            else:
                parts.append((id(data), repr(type(data))))
    elif isinstance(value, (bytearray, memoryview)):
        parts.append((len(value), _sample_crc(memoryview(value).cast("B"))))
    elif isinstance(value, (list, tuple)):
        parts.append((len(value), _sampled_ids(value)))
    elif isinstance(value, dict):
        first = list(itertools.islice(value.items(), _ITEMS))  # a copy of them all costs seconds
        parts.append((len(value), _sampled_ids(first)))
    elif isinstance(value, (set, frozenset)):
        parts.append((len(value), sum(map(id, value)) if len(value) < 100_000 else None))
    else:
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            parts.append(tuple((key, id(item)) for key, item in list(attributes.items())[:200]))


def _array_parts(array):
    data = array.__array_interface__["data"][0] if array.ndim else None
    crc = None
    if array.flags.c_contiguous or array.flags.f_contiguous:
        try:
            crc = _sample_crc(memoryview(array).cast("B"))
        except (TypeError, ValueError):  # object arrays and the like have no plain bytes
            crc = _sampled_ids(array.ravel().tolist()) if array.dtype.hasobject else None
    return (array.shape, array.dtype.str, array.strides, data, crc)


def _sample_crc(view):
    """CRC-32 of the first and last 4 KiB of `view` and of _SAMPLES windows spread over it."""
    size = view.nbytes
    if size <= 2 * 4096 + _SAMPLES * _WINDOW:
        return zlib.crc32(view)
    crc = zlib.crc32(view[:4096])
    crc = zlib.crc32(view[size - 4096:], crc)
    step = size // _SAMPLES
    for at in range(0, size - _WINDOW, step):
        crc = zlib.crc32(view[at:at + _WINDOW], crc)
    return crc


def _sampled_ids(items):
    count = len(items)
    if count <= _ITEMS:
        picks = range(count)
    else:
        picks = sorted({0, count - 1, *range(0, count, max(1, count // _ITEMS))})
    return tuple(_item_id(items[i]) for i in picks)


def _item_id(item):
    if isinstance(item, tuple):
        return tuple(map(id, item))
    return id(item)


def _numpy_type():
    module = sys.modules.get("numpy")
    return getattr(module, "ndarray", None)


def _pandas_type(name):
    module = sys.modules.get("pandas")
    return getattr(module, name, None)
