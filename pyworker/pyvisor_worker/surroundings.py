"""What a cell's output depends on outside the namespace: the files it read, and the ambient.

Files: one audit hook, installed once at worker start (``install()``), sees every "open" event
of the process but records only while ``recording()`` is active (a cell with facts, a
speculative snippet). It keeps the opens for reading (no write access, no O_CREAT or O_TRUNC)
of str or bytes paths, made absolute against the working directory at open time, at most
MAX_FILES of them; the interpreter's own files (modules and data under its prefixes, .py/.pyc/
.so files anywhere), the system's (/etc, /usr/lib, time zones) and pseudo files (/proc, /sys,
/dev) are left out. After the run each path
is stamped with its stat: {"path", "size", "mtime_ns", "ctime_ns", "inode"}; a path that is
gone by then is left out.

Ambient: a short hex token of the state that changes what code prints without being in the
namespace: the working directory, pandas' option values (only if the session imported pandas)
and numpy's print options (only if it imported numpy). Nothing is imported to compute it.
Options that cannot be read make a token equal to no other.
"""

import itertools
import os
import stat
import sys
import zlib

MAX_FILES = 64

# Opens that may change a file, or that are not of a file someone could rewrite under us.
_WRITING_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CODE_SUFFIXES = (".py", ".pyc", ".so", ".pth")
_IGNORED_PREFIXES = tuple(sorted({
    os.path.join(prefix, "") for prefix in
    (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
     os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
} | {"/proc/", "/sys/", "/dev/", "/etc/", "/usr/lib/", "/usr/lib64/", "/usr/share/zoneinfo/"}))

_unknown = itertools.count()  # options that cannot be read make a token equal to no other
_opened = None  # dict path -> None while recording (ordered, deduplicated), else None


def install():
    """Install the audit hook; once, at worker start (audit hooks cannot be removed)."""
    sys.addaudithook(_audit)


def _audit(event, args):
    opened = _opened
    if opened is None or event != "open":
        return
    path, _mode, flags = args
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, str) or (isinstance(flags, int) and flags & _WRITING_FLAGS):
        return
    if len(opened) >= MAX_FILES or path.endswith(_CODE_SUFFIXES):
        return
    try:
        path = os.path.abspath(path)
    except (OSError, ValueError):  # the working directory is gone, or a NUL in the path
        return
    if not path.startswith(_IGNORED_PREFIXES):
        opened[path] = None


class recording:
    """Context manager: record the files opened for reading while it is active."""

    __slots__ = ("paths",)

    def __init__(self):
        self.paths = []

    def __enter__(self):
        global _opened
        _opened = {}
        return self

    def __exit__(self, *exc):
        global _opened
        self.paths, _opened = list(_opened), None
        return False


def stamps(paths):
    """The file stamps of `paths` as they are now; paths that are gone are left out."""
    found = []
    for path in paths:
        stamp = stamp_of(path)
        if stamp is not None:
            found.append(stamp)
    return found


def stamp_of(path):
    """{"path", "size", "mtime_ns", "ctime_ns", "inode"} of the file at `path`; None if gone."""
    try:
        info = os.stat(path)
    except (OSError, ValueError, TypeError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return {"path": path, "size": info.st_size, "mtime_ns": info.st_mtime_ns,
            "ctime_ns": info.st_ctime_ns, "inode": info.st_ino}


def ambient():
    """The ambient token: a hex hash of the working directory and display options."""
    try:
        parts = [os.getcwd()]
    except OSError:  # the working directory was removed
        parts = ["<no cwd>"]
    pandas = sys.modules.get("pandas")
    if pandas is not None:
        parts.append(_pandas_options(pandas))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            parts.append(repr(sorted(numpy.get_printoptions().items())))
        except Exception:
            parts.append("numpy options unknown %d" % next(_unknown))
    return "%08x" % zlib.crc32("\0".join(parts).encode("utf-8", "surrogatepass"))


def _pandas_options(pandas):
    """The values of pandas' options: its option registry's nested dict, pandas 1 to 3."""
    config = sys.modules.get("pandas._config.config")
    values = getattr(config, "_global_config", None)
    if isinstance(values, dict):
        try:
            return repr(values)
        except Exception:
            pass
    return "pandas options unknown %d" % next(_unknown)
