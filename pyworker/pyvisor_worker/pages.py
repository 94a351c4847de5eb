"""Taking back the worker's pages after a fork, while the session is idle.

fork() write-protects every private page of the worker, to share it with the child. Once the
child is gone each page is the worker's alone again, but the protection stays until the page
is next written: the next execution then takes a page fault for every page it writes
(Python writes reference counts into every object it reads), about 1,400 faults for a
`describe()` of a small frame with pandas loaded, which on a virtual machine cost as much as
the computation. ``reclaim()`` makes those pages writable again ahead of time with
madvise(MADV_POPULATE_WRITE) (Linux 5.14+), which changes no byte. Only pages that are
present, anonymous and mapped by this process alone are touched: nothing new is allocated,
and a page still shared with a live child (a checkpoint's, or one the session's code forked)
is left shared rather than copied.

It runs only while the session is idle: the main thread holds it off while it serves an
execute or a restore (``hold_off()``, ``go_on()``), which would otherwise wait for the CPU,
the interpreter lock and the address space's lock behind it, and it then starts again from
the mappings it had not finished.
"""

import ctypes
import os
import re
import threading

_PAGE = os.sysconf("SC_PAGE_SIZE")
_MADV_POPULATE_WRITE = 23
# Pages taken back at most per call (1 GiB of 4 KiB pages), the smallest mappings first:
# the interpreter's objects live in small ones, large arrays that are only read in large ones.
_MAX_PAGES = 1 << 18
# Byte 7 of a /proc/self/pagemap entry: bit 63 present, 62 swapped, 61 file page or shared
# anonymous, 56 mapped by this process alone (not shared with a child still alive).
_OURS_ALONE = bytes(1 if byte & 0xE1 == 0x81 else 0 for byte in range(256))
_RUNS = re.compile(rb"\x01+")

_madvise = None  # libc's madvise, once it is known to take MADV_POPULATE_WRITE
_unsupported = False
_idle = threading.Event()  # clear while the main thread serves a request
_idle.set()


def hold_off():
    """Main thread, taking up an execute or a restore: no reclaim until ``go_on()``."""
    _idle.clear()


def go_on():
    """Main thread, done with the request: a reclaim held off goes on."""
    _idle.set()


def forget_in_clone():
    """In a clone of the session (see cloning): no reclaim runs, and the source's thread may
    have held the event's lock when it forked."""
    global _idle
    _idle = threading.Event()
    _idle.set()


def _load():
    """libc's madvise if the kernel takes MADV_POPULATE_WRITE (tried on a page of our own)."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    probe = ctypes.create_string_buffer(2 * _PAGE)
    page = -(-ctypes.addressof(probe) // _PAGE) * _PAGE
    return madvise if madvise(page, _PAGE, _MADV_POPULATE_WRITE) == 0 else None


def _mappings():
    """(start, end) of every private writable mapping, the smallest first."""
    with open("/proc/self/maps", "rb") as maps:
        lines = maps.read().splitlines()
    found = []
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 5 or fields[1] != b"rw-p":
            continue
        if len(fields) > 5 and fields[5].startswith(b"[v"):  # [vvar], [vdso], [vsyscall]
            continue
        start, end = (int(bound, 16) for bound in fields[0].split(b"-"))
        found.append((start, end))
    found.sort(key=lambda mapping: mapping[1] - mapping[0])
    return found


def reclaim():
    """Make the present private pages of this process writable again; the number of pages.

    A thread's: it waits while the main thread serves a request (see ``hold_off()``). Never
    raises: on a kernel without MADV_POPULATE_WRITE, or without /proc, it does nothing from
    then on.
    """
    global _madvise, _unsupported
    if _unsupported:
        return 0
    if _madvise is None:
        _madvise = _load()
        if _madvise is None:
            _unsupported = True
            return 0
    finished = set()  # mappings taken back whole, not walked again after a wait
    done = 0
    try:
        while True:
            _idle.wait()
            done, complete = _walk(finished, done)
            if complete:
                return done
    except OSError:  # no /proc
        _unsupported = True
    return done


def _walk(finished, done):
    """Take back the pages of the mappings not in `finished` (adding those it completes)
    until `done` pages are, or the main thread takes up a request: (done, whether every
    mapping was walked). A wait makes what was read of the mappings stale."""
    pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
    try:
        for start, end in _mappings():
            if (start, end) in finished:
                continue
            pages = min((end - start) // _PAGE, _MAX_PAGES - done)
            if pages <= 0:
                break
            entries = os.pread(pagemap, pages * 8, start // _PAGE * 8)
            for run in _RUNS.finditer(entries[7::8].translate(_OURS_ALONE)):
                if not _idle.is_set():
                    return done, False
                length = (run.end() - run.start()) * _PAGE
                if _madvise(start + run.start() * _PAGE, length, _MADV_POPULATE_WRITE):
                    continue  # the mapping changed meanwhile, or cannot be populated
                done += run.end() - run.start()
            finished.add((start, end))
    finally:
        os.close(pagemap)
    return done, True
