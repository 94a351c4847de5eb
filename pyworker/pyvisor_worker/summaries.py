"""Object summaries: a bounded description of a data object, for a cell's facts.

``summary(name, value)`` describes pandas DataFrames and Series, numpy arrays, lists, tuples,
dicts and sets (None for other values): {"name", "kind" (the type's own name), "module" (its
top-level module), "len", "shape", "columns", "index"}. Other pandas objects are described by
kind only, an Index with its length too (never the length of a GroupBy: it would group). A
frame lists its first MAX_COLUMNS columns, a Series itself as one column: {"name" (str() of
the label), "label_is_str", "dtype", "nulls", "distinct"}. On frames of more than SAMPLE_ABOVE rows both counts come from SAMPLE
rows spread evenly over it: nulls scaled to the whole, distinct as found in the sample (an
estimate, low for columns of mostly unique values). A count pandas cannot compute (unhashable
values) is 0. The summary of a value whose content fingerprint has not changed since the last
facts is reused, so a frame that cell after cell only reads is counted once.

Literals the predictor can write, from the session's own data (they go to the engine in the
facts only): "labels", the first MAX_LABELS distinct string labels among the first
LABELS_SCANNED of an index that is not a RangeIndex, and per column "values", the MAX_VALUES
most frequent string values (counted on about VALUES_SAMPLE rows spread evenly over the sample)
of an object, category or string column of at most VALUED_DISTINCT distinct values, for at most
VALUED_COLUMNS columns. Each literal is at most MAX_TEXT characters (longer ones are left out)
and an object's literals at most MAX_LITERAL_BYTES in all; values that cannot be read leave
their columns without.
"""

import collections
import sys

from pyvisor_worker import fingerprints

MAX_COLUMNS = 200
SAMPLE_ABOVE = 2000
SAMPLE = 1000
MAX_LABELS = 5
LABELS_SCANNED = 20
MAX_VALUES = 5
VALUED_DISTINCT = 50
VALUED_COLUMNS = 16
VALUES_SAMPLE = 100
MAX_TEXT = 40
MAX_LITERAL_BYTES = 2048

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
    described = dict(name=name, kind=kind.__name__, module=module, **_pandas_summary(value))
    _cache[name] = (fingerprint, described)
    return described


def forget(names):
    """Drop the cached summaries of `names`, which are no longer bound."""
    for name in names:
        _cache.pop(name, None)


def _pandas_summary(value):
    pandas = sys.modules["pandas"]
    if isinstance(value, pandas.DataFrame):
        frame, shape = value.iloc[:, :MAX_COLUMNS], list(value.shape)
    elif isinstance(value, pandas.Series):
        frame, shape = value.to_frame(_label(value.name)), [len(value)]
    elif isinstance(value, pandas.Index):
        return {"len": len(value), "shape": [len(value)]}
    else:
        return {}
    sample = _spread(frame, SAMPLE) if len(frame) > SAMPLE_ABOVE else frame
    columns = _columns(frame, sample, len(frame))
    described = {"len": len(value), "shape": shape, "index": _index_kind(value),
                 "columns": columns}
    budget = [MAX_LITERAL_BYTES]
    labels = _labels(value, pandas, budget)
    if labels:
        described["labels"] = labels
    _values(sample, columns, budget)
    return described


def _spread(frame, rows):
    """`rows` rows of `frame` spread evenly over it (all of them when it has no more)."""
    if len(frame) <= rows:
        return frame
    step = len(frame) / rows
    return frame.iloc[[int(i * step) for i in range(rows)]]


def _label(name):
    return "" if name is None else name


def _index_kind(value):
    return type(value.index).__name__


def _labels(value, pandas, budget):
    """The first string labels of the index of `value`, unless it is a RangeIndex."""
    index = value.index
    if isinstance(index, pandas.RangeIndex):
        return []
    try:
        head = index[:LABELS_SCANNED].tolist()
    except Exception:  # an index subclass's own code may raise
        return []
    return _texts(head, MAX_LABELS, budget)


def _values(sample, columns, budget):
    """Adds "values" to the low-cardinality text columns of `columns`, from `sample`."""
    positions = [position for position, column in enumerate(columns)
                 if 0 < column["distinct"] <= VALUED_DISTINCT
                 and column["dtype"].startswith(("object", "category", "str", "string"))]
    if not positions:
        return
    positions = positions[:VALUED_COLUMNS]
    step = max(1, len(sample) // VALUES_SAMPLE)
    for position in positions:
        if budget[0] <= 0:
            return
        try:
            items = sample.iloc[:, position].to_numpy(dtype=object)[::step].tolist()
        except Exception:  # a column whose own code raises
            continue
        counted = collections.Counter(
            item for item in items if type(item) is str and len(item) <= MAX_TEXT)
        ranked = sorted(counted.items(), key=lambda pair: (-pair[1], pair[0]))
        found = _texts([text for text, _ in ranked], MAX_VALUES, budget)
        if found:
            columns[position]["values"] = found


def _texts(items, limit, budget):
    """The first `limit` distinct short strings of `items`, while `budget` (bytes left) lasts."""
    found = []
    for item in items:
        if len(found) == limit:
            break
        if type(item) is not str or len(item) > MAX_TEXT or item in found:
            continue
        size = len(item.encode("utf-8", "replace"))
        if size > budget[0]:
            break
        budget[0] -= size
        found.append(item)
    return found


def _columns(frame, sample, rows):
    """The column summaries of `frame`, which has `rows` rows, counted on `sample`."""
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
