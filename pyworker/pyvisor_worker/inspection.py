"""Inspect: what the namespace holds, for the host to show without running any code.

"variables" are the namespace's names, sorted, but the dunder ones, with the qualified name of
their value's type and its approximate size: nbytes for numpy values, memory_usage() for pandas
ones (deep up to 100,000 rows), sys.getsizeof() for others, one level deep for lists, tuples,
sets and dicts (extrapolated from their first 100,000 items); null when it cannot be had.
"definitions" are those that a checkpoint would save as source; "rss_bytes" comes from
/proc/self/statm.
"""

import os
import sys

from pyvisor_worker import state

_SIZE_ITEMS = 100_000  # items of a container sized one by one; beyond, extrapolated


def inspect(request):
    """The inspect_done reply; runs on the control thread, also while code runs, and never fails.

    It works from copies of the namespace and of the definitions, which the GIL makes whole.
    """
    variables, definitions = [], []
    try:
        items = sorted(
            (item for item in list(state.namespace.items()) if state.is_user_name(item[0])),
            key=lambda item: item[0],
        )
        for name, value in items:
            variables.append({"name": name, "type": _type_name(value), "size_bytes": _size(value)})
        for name, (kind, source, value) in list(state.definitions.items()):
            if state.namespace.get(name, state.MISSING) is value:
                definitions.append({"name": name, "kind": kind, "source": source})
    except Exception:  # what was found so far
        pass
    return {
        "type": "inspect_done",
        "id": request.get("id"),
        "variables": variables,
        "definitions": definitions,
        "rss_bytes": _rss_bytes(),
    }


def _type_name(value):
    """The qualified name of the type of `value`: "int", "pandas.core.frame.DataFrame"."""
    kind = type(value)
    try:
        module, name = kind.__module__, kind.__qualname__
    except Exception:
        return kind.__name__
    return name if module in (None, "builtins") else "%s.%s" % (module, name)


def _size(value):
    """Approximate size of `value` in bytes (see the docstring); None when unknown."""
    import itertools

    kind = type(value)
    try:
        module = kind.__module__ or ""
        if module.startswith("numpy") and hasattr(value, "nbytes"):
            return int(value.nbytes)
        if module.startswith("pandas") and hasattr(value, "memory_usage"):
            deep = len(value) <= _SIZE_ITEMS
            try:
                usage = value.memory_usage(index=True, deep=deep)
            except TypeError:  # an Index: no index argument
                usage = value.memory_usage(deep=deep)
            return int(usage.sum() if hasattr(usage, "sum") else usage)
        size = sys.getsizeof(value)
        if kind in (list, tuple, set, frozenset, dict):
            items = value.items() if kind is dict else value
            count = len(value)
            first = itertools.islice(items, _SIZE_ITEMS)
            if kind is dict:
                inner = sum(sys.getsizeof(key) + sys.getsizeof(item) for key, item in first)
            else:
                inner = sum(map(sys.getsizeof, first))
            size += inner if count <= _SIZE_ITEMS else inner * count // _SIZE_ITEMS
        return int(size)
    except Exception:
        return None


def _rss_bytes():
    """The resident memory of the worker, from /proc/self/statm; None when unknown."""
    try:
        with open("/proc/self/statm", "rb") as file:
            pages = int(file.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
