"""Content fingerprints: a short token equal for values of equal content, in any process.

A speculative run stamps each name it reads with the fingerprint of its value, and an adopt
compares the stamps with the values the worker holds by then: a value rebuilt by a real cell
(``y = x * 2`` run for real after a speculative ``y = x * 2``) has the fingerprint of the
speculative one. So fingerprints of data never use addresses or id():

- numbers, str, bytes, None, bool, complex: type and repr (a CRC-32 and the length for long
  strings and bytes);
- numpy arrays: dtype, shape and a CRC-32 of the data in C order, all of it up to WHOLE_BYTES,
  beyond that of SAMPLES windows spread over it from its first to its last bytes; object
  arrays: length and a CRC-32 of the reprs of all items up to WHOLE_ITEMS, else of SAMPLES;
- pandas: a DataFrame by its columns, dtypes, index and each column's values in column order
  (so two frames of one content whose blocks were consolidated differently agree), its columns
  sharing the budget of one array (WHOLE_BYTES, WHOLE_ITEMS and SAMPLES divided among them,
  at least 2 samples each, so a frame costs about what an array does); a Series by
  its name, dtype, index and values; an Index by its type, names and values (a RangeIndex by
  its range) and whether its hash table is built (a label lookup builds it, and a frame's
  memory usage, as ``df.info()`` prints it, counts it); extension arrays by the arrays they hold (codes and categories, data and mask,
  Arrow buffers), else by sampled items;
- list, tuple, dict, set, frozenset: type, length and the fingerprints of up to ITEMS sampled
  items (keys and values of a dict), DEPTH levels deep;
- modules: their name;
- anything else, and containers deeper than DEPTH: type and id(), equal only for the same
  object in the same process (or in a child forked from it), which is always safe.

Sampling means that a change confined to bytes or items that were not sampled goes unseen; the
host also drops what a cell's facts say it touched. Reprs of data are hashed with zlib.crc32,
never hash(), which differs between processes.
"""

import hashlib
import sys
import types
import zlib

WHOLE_BYTES = 256 * 1024  # arrays up to this size are hashed whole: about 0.08 ms
WHOLE_ITEMS = 1024  # object arrays up to this length have the repr of every item hashed
SAMPLES = 64  # sampled windows of a large array, sampled items of a long object array
WINDOW = 256  # bytes per sampled window
ITEMS = 16  # sampled items of a container
DEPTH = 3  # containers nested deeper are fingerprinted by identity
_LONG = 256  # strings and bytes longer than this are hashed, not spelled out

_SCALARS = (int, float, complex, bool, type(None))


def content_fingerprint(value):
    """A 16-hex-digit token equal for values of equal content (see the module docstring)."""
    parts = []
    try:
        _describe(value, parts, 0)
    except Exception:  # the value's own code may raise: then it is equal only to itself
        parts = [_identity(value)]
    return hashlib.blake2b(repr(parts).encode("utf-8", "surrogatepass"),
                           digest_size=8).hexdigest()


def _describe(value, parts, depth):
    kind = type(value)
    if kind in _SCALARS or issubclass(kind, _SCALARS):
        parts.append((kind.__name__, repr(value)))
    elif issubclass(kind, (str, bytes, bytearray)):
        parts.append(_text(value))
    elif issubclass(kind, types.ModuleType):
        parts.append(("module", getattr(value, "__name__", None)))
    elif issubclass(kind, (list, tuple, dict, set, frozenset)):
        if depth >= DEPTH:
            parts.append(_identity(value))
        else:
            _container(value, parts, depth)
    else:
        describe = _data_describer(value)
        if describe is None:
            parts.append(_identity(value))
        else:
            describe(value, parts)


def _text(value):
    kind = type(value).__name__
    if len(value) <= _LONG:
        return kind, repr(value)
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    return kind, len(value), zlib.crc32(data)


def _identity(value):
    kind = type(value)
    return "%s.%s" % (kind.__module__, kind.__qualname__), id(value)


def _container(value, parts, depth):
    parts.append((type(value).__name__, len(value)))
    if isinstance(value, dict):
        items = value.items() if len(value) <= ITEMS else _sampled(list(value.items()))
        for key, item in items:
            _describe(key, parts, depth + 1)
            _describe(item, parts, depth + 1)
        return
    if isinstance(value, (set, frozenset)):  # in iteration order: a fork keeps it
        value = list(value)
    for item in value if len(value) <= ITEMS else _sampled(value):
        _describe(item, parts, depth + 1)


def _sampled(items, count=ITEMS):
    length = len(items)
    if length <= count:
        return items
    step = length / count
    return [items[int(i * step)] for i in range(count)] + [items[-1]]


def _data_describer(value):
    """The function that describes `value`, a numpy or pandas object; None for other values."""
    module = type(value).__module__.partition(".")[0]
    if module == "numpy":
        numpy = sys.modules["numpy"]
        if isinstance(value, numpy.ndarray):
            return _array
        if isinstance(value, numpy.generic):
            return _numpy_scalar
    elif module == "pandas":
        pandas = sys.modules["pandas"]
        for kind, describe in ((pandas.DataFrame, _frame), (pandas.Series, _series),
                               (pandas.Index, _index)):
            if isinstance(value, kind):
                return describe
        extension = getattr(getattr(pandas, "api", None), "extensions", None)
        if extension is not None and isinstance(value, extension.ExtensionArray):
            return _values
    return None


def _numpy_scalar(value, parts):
    parts.append((value.dtype.str, repr(value.item())))


def _array(array, parts, share=1):
    """Describe `array`; `share` > 1 when it is one of that many columns of a frame, which
    then share the budget of one array."""
    parts.append(("ndarray", array.dtype.str, array.shape))
    samples = max(2, SAMPLES // share)
    if array.dtype.hasobject:
        whole = array.size <= WHOLE_ITEMS // share
        flat = array.ravel() if whole else array.flat[_positions(array.size, samples)]
        text = "\0".join(map(repr, flat.tolist()))
        parts.append((array.size, zlib.crc32(text.encode("utf-8", "surrogatepass"))))
    elif array.nbytes <= WHOLE_BYTES // share:
        parts.append(zlib.crc32(memoryview(_contiguous(array)).cast("B")))
    elif array.flags.c_contiguous:
        parts.append((array.nbytes, _sampled_crc(memoryview(array).cast("B"), samples)))
    else:  # a large view in another order: its items at the sampled positions, in C order
        numpy = sys.modules["numpy"]
        runs = numpy.ascontiguousarray(array.flat[_positions(array.size, samples, WINDOW)])
        parts.append((array.nbytes, zlib.crc32(memoryview(runs).cast("B"))))


def _contiguous(array):
    if array.flags.c_contiguous:
        return array
    return sys.modules["numpy"].ascontiguousarray(array)


def _positions(size, samples, run=1):
    """Flat positions of `samples` runs of `run` items spread over `size`, and the last."""
    numpy = sys.modules["numpy"]
    starts = numpy.linspace(0, max(size - run, 0), samples, dtype=numpy.int64)
    positions = (starts[:, None] + numpy.arange(run)[None, :]).ravel()
    return numpy.append(positions[positions < size], size - 1)


def _sampled_crc(view, samples):
    """CRC-32 of `samples` windows spread evenly over `view`, the first and the last included."""
    size, crc = view.nbytes, 0
    for at in range(samples):
        start = (size - WINDOW) * at // (samples - 1)
        crc = zlib.crc32(view[start:start + WINDOW], crc)
    return crc


def _frame(frame, parts):
    parts.append(("DataFrame", frame.shape, _text(repr(list(frame.columns)))))
    _index(frame.index, parts)
    try:
        columns = _block_columns(frame)
    except Exception:  # a pandas without these internals: column by column, slower
        columns = []
        share = max(1, frame.shape[1])
        for values in frame._iter_column_arrays():
            columns.append([])
            _values(values, columns[-1], share)
    parts.extend(columns)


def _block_columns(frame):
    """The description of each column of `frame`, in column order, from its blocks.

    Each column of a 2-D numeric block is hashed on the same rows: all of them for a frame of
    at most WHOLE_BYTES, else runs of them spread over the frame, as many as its share of
    SAMPLES allows."""
    numpy = sys.modules["numpy"]
    rows, width = frame.shape
    share = max(1, width)
    picks = None
    if rows * width * 8 > WHOLE_BYTES:
        picks = _positions(rows, max(2, SAMPLES // share), WINDOW // 8)
    columns = [None] * width
    for block in frame._mgr.blocks:
        values, places = block.values, block.mgr_locs.as_array
        if isinstance(values, numpy.ndarray) and values.ndim == 2 and not values.dtype.hasobject:
            kept = numpy.ascontiguousarray(values if picks is None else values[:, picks])
            for place, row in zip(places.tolist(), kept):
                columns[place] = (values.dtype.str, rows, zlib.crc32(row))
            continue
        for position, place in enumerate(places.tolist()):
            column = values[position] if isinstance(values, numpy.ndarray) else values
            columns[place] = []
            _values(column, columns[place], share)
    return columns


def _series(series, parts):
    parts.append(("Series", repr(series.name), str(series.dtype), len(series)))
    _index(series.index, parts)
    _values(series._values, parts)


def _index(index, parts):
    pandas = sys.modules["pandas"]
    parts.append((type(index).__name__, repr(list(index.names)), str(index.dtype), len(index),
                  "_engine" in getattr(index, "_cache", ())))
    if isinstance(index, pandas.RangeIndex):
        parts.append((index.start, index.stop, index.step))
    elif isinstance(index, pandas.MultiIndex):
        for level, codes in zip(index.levels, index.codes):
            _index(level, parts)
            _array(codes, parts)
    else:
        _values(index._values, parts)


def _values(values, parts, share=1):
    """The data of a column: a numpy array, or a pandas extension array by what it holds."""
    numpy = sys.modules["numpy"]
    if isinstance(values, numpy.ndarray):
        _array(values, parts, share)
        return
    parts.append((type(values).__name__, str(values.dtype), len(values)))
    held = [getattr(values, name, None) for name in ("_ndarray", "_data", "_mask", "_codes")]
    held = [array for array in held if isinstance(array, numpy.ndarray)]
    categories = getattr(getattr(values, "dtype", None), "categories", None)
    arrow = getattr(values, "_pa_array", None)
    if held:
        for array in held:
            _array(array, parts, share)
        if categories is not None:
            _index(categories, parts)
    elif arrow is not None:
        for chunk in arrow.chunks:
            parts.append((chunk.offset, len(chunk)))
            for buffer in chunk.buffers():
                if buffer is not None:
                    view = memoryview(buffer)
                    whole = view.nbytes <= WHOLE_BYTES // share
                    parts.append(zlib.crc32(view) if whole else _sampled_crc(view, SAMPLES))
    else:  # an extension array of an unknown kind: the reprs of sampled items
        whole = len(values) <= WHOLE_ITEMS // share
        picks = slice(None) if whole else _positions(len(values), max(2, SAMPLES // share))
        text = "\0".join(map(repr, values[picks].tolist()))
        parts.append(zlib.crc32(text.encode("utf-8", "surrogatepass")))
