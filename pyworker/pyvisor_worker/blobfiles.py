"""Blob files: the pickled values of one group of names, as a checkpoint writes them.

A blob file holds one pickle (protocol 5) of the tuple of the group's values, so that names
which share objects share them again once loaded, and the pickle's out-of-band buffers (the
data of numpy arrays and pandas blocks, 64 KiB or more each) as raw bytes, each starting on a
page boundary, so that a restore can map them from the file instead of reading them:

    b"PYVBLOB1"
    the pickle stream
    for each buffer: zero bytes up to the next multiple of 4096, then the buffer
    for the pickle stream and each buffer: its offset and length, 8 bytes each, big-endian
    the number of buffers (8 bytes, big-endian), then b"PYVBEND1"

A file of MAP_MIN bytes or more is mapped copy-on-write (MAP_PRIVATE): the values' buffers
are views of the mapping, whose pages are read from the file when first touched, and writes
to them stay private to the process. Smaller files are read.
"""

import mmap
import os
import struct

MAGIC = b"PYVBLOB1"
END = b"PYVBEND1"
PAGE = 4096
MAP_MIN = 1024 * 1024
OUT_OF_BAND_MIN = 64 * 1024  # smaller pickle buffers stay in the pickle stream
_PLACE = struct.Struct(">QQ")
_COUNT = struct.Struct(">Q")


class OverLimit(Exception):
    """The state written so far exceeds the checkpoint's limit."""

    def __init__(self, written, limit):
        super().__init__(written, limit)
        self.written, self.limit = written, limit


class Budget:
    """The bytes a checkpoint may still write before it is over its limit."""

    def __init__(self, limit):
        self.limit, self.used = limit, 0

    def spend(self, nbytes):
        self.used += nbytes
        if self.used > self.limit:
            raise OverLimit(self.used, self.limit)


def write(path, values, pickler_factory, budget):
    """Pickle the tuple `values` to a new file `path` (mode 0600); return its length.

    `pickler_factory(file, buffer_callback)` makes the pickler. Raises OverLimit when the
    budget runs out, and whatever pickling raises; the caller removes the file then.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as file:
        file.write(MAGIC)
        buffers = []

        def keep_out_of_band(buffer):
            try:
                view = buffer.raw()
            except BufferError:  # not contiguous: it stays in the stream
                return True
            if view.nbytes < OUT_OF_BAND_MIN:
                return True
            budget.spend(view.nbytes)
            buffers.append(view)
            return False

        pickler_factory(file, keep_out_of_band).dump(tuple(values))
        places = [(len(MAGIC), file.tell() - len(MAGIC))]
        budget.spend(places[0][1])
        for view in buffers:
            at = file.tell()
            padding = -at % PAGE
            if padding:
                file.write(bytes(padding))
            places.append((at + padding, view.nbytes))
            file.write(view)  # a large write goes from the buffer to the file, no copy
        for place in places:
            file.write(_PLACE.pack(*place))
        file.write(_COUNT.pack(len(buffers)))
        file.write(END)
        return file.tell()


def read(path):
    """The tuple of values that the blob file `path` holds."""
    import pickle

    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        tail = len(END) + _COUNT.size
        if size < len(MAGIC) + _PLACE.size + tail or file.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a pyvisor blob file")
        file.seek(size - tail)
        (count,) = _COUNT.unpack(file.read(_COUNT.size))
        if file.read(len(END)) != END:
            raise ValueError("the blob file is cut short")
        table = (count + 1) * _PLACE.size
        if table > size - tail:
            raise ValueError("the blob file's table is corrupt")
        file.seek(size - tail - table)
        places = [_PLACE.unpack_from(chunk, 0) for chunk in _chunks(file.read(table), _PLACE.size)]
        for offset, length in places:
            if offset + length > size - tail - table:
                raise ValueError("the blob file's table points past its end")
        (stream_at, stream_length), buffer_places = places[0], places[1:]
        if size >= MAP_MIN and buffer_places:
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
            whole = memoryview(mapping)
            buffers = [whole[offset:offset + length] for offset, length in buffer_places]
            stream = whole[stream_at:stream_at + stream_length]
        else:
            buffers = []
            for offset, length in buffer_places:  # writable, so that arrays made on them are
                buffer = bytearray(length)
                file.seek(offset)
                if file.readinto(buffer) != length:
                    raise EOFError("the blob file is cut short")
                buffers.append(buffer)
            file.seek(stream_at)
            stream = file.read(stream_length)
        values = pickle.loads(stream, buffers=buffers)
    if not isinstance(values, tuple):
        raise ValueError("the blob file does not hold a tuple")
    return values


def _chunks(data, size):
    return [data[at:at + size] for at in range(0, len(data), size)]
