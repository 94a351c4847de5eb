"""Object summaries: a bounded description of a data object, for a cell's facts.

``summary(name, value)`` describes pandas DataFrames and Series, numpy arrays, lists, tuples,
dicts and sets (None for other values): {"name", "kind" (the type's own name), "module" (its
top-level module), "len", "shape", "columns", "index"}. A frame lists its first MAX_COLUMNS
columns, a Series itself as one column: {"name" (str() of the label), "label_is_str", "dtype",
"nulls", "distinct"}. On frames of more than SAMPLE_ABOVE rows both counts come from SAMPLE
rows spread evenly over it: nulls scaled to the whole, distinct as found in the sample (an
estimate, low for columns of mostly unique values). A count pandas cannot compute (unhashable
values) is 0. The summary of a value whose content fingerprint has not changed since the last
facts is reused, so a frame that cell after cell only reads is counted once.
"""

import sys

from pyvisor_worker import fingerprints

MAX_COLUMNS = 200
SAMPLE_ABOVE = 2000
SAMPLE = 1000

_CONTAINERS = (list, tuple, dict, set, frozenset)
_cache = {}  # name -> (content fingerprint of its value, summary)


def summary(name, value):
    """The summary of `value`, bound to `name`; None for a value that is not data."""
    kind = type(value)
    module = kind.__module__.partition(".")[0]
    if issubclass(kind, _CONTAINERS):
        return {"name": name, "kind": kind.__name__, "module": module, "len": len(value)}
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return {"name": name, "kind": kind.__name__, "module": module,
                "len": len(value) if value.ndim else None, "shape": list(value.shape)}
    if module != "pandas":
        return None
    fingerprint = fingerprints.content_fingerprint(value)
    cached = _cache.get(name)
    if cached is not None and cached[0] == fingerprint:
        return cached[1]
    described = _pandas_summary(value)
    if described is not None:
        described = dict(name=name, kind=kind.__name__, module=module, **described)
        _cache[name] = (fingerprint, described)
    return described


def forget(names):
    """Drop the cached summaries of `names`, which are no longer bound."""
    for name in names:
        _cache.pop(name, None)


def _pandas_summary(value):
    pandas = sys.modules["pandas"]
    if isinstance(value, pandas.DataFrame):
        return {"len": len(value), "shape": list(value.shape), "index": _index_kind(value),
                "columns": _columns(value.iloc[:, :MAX_COLUMNS], len(value))}
    if isinstance(value, pandas.Series):
        return {"len": len(value), "shape": [len(value)], "index": _index_kind(value),
                "columns": _columns(value.to_frame(_label(value.name)), len(value))}
    return None


def _label(name):
    return "" if name is None else name


def _index_kind(value):
    return type(value.index).__name__


def _columns(frame, rows):
    """The column summaries of `frame`, which has `rows` rows."""
    sample = frame
    if rows > SAMPLE_ABOVE:
        step = rows / SAMPLE
        sample = frame.iloc[[int(i * step) for i in range(SAMPLE)]]
    scale = rows / len(sample) if len(sample) else 1
    nulls = _counts(sample, lambda part: part.isna().sum())
    distinct = _counts(sample, lambda part: part.nunique())
    dtypes, columns = frame.dtypes.tolist(), []
    for position, label in enumerate(frame.columns):
        columns.append({
            "name": str(label),
            "label_is_str": isinstance(label, str),
            "dtype": str(dtypes[position]),
            "nulls": round(nulls[position] * scale),
            "distinct": distinct[position],
        })
    return columns


def _counts(sample, count):
    """count(sample) as a list of ints per column; column by column where that fails."""
    try:
        return [int(n) for n in count(sample).tolist()]
    except Exception:
        pass
    found = []
    for position in range(sample.shape[1]):
        part = sample.iloc[:, [position]]
        try:
            found.append(int(count(part).iloc[0]))
        except Exception:
            try:
                found.append(int(count(part.astype(str)).iloc[0]))
            except Exception:
                found.append(0)
    return found
