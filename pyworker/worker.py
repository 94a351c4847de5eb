"""pyvisor worker: runs the Python code of one pyvisor session.

The host starts it as ``python3 -I -u worker.py`` in its own process group, with fd 0 reading
/dev/null, fds 1 and 2 pipes whose contents the host attributes to the running execution, and
the protocol on two more pipes: fd 3 (host -> worker) and fd 4 (worker -> host). Standard
library only; Python 3.9 or newer.

Framing, both ways: a 4-byte big-endian unsigned length, then that many bytes of UTF-8 JSON
holding one object. No frame is larger than 32 MiB: the worker sends a smaller stand-in for a
message that would be (see ``_stand_in``), and takes a larger incoming one for a corrupt stream.

Host -> worker:

    {"type": "execute", "id": "e-1", "code": "...", "repr_limit": 65536,
     "transaction": "commit_always" | "rollback_on_failure"}     commit_always when absent
    {"type": "input_reply", "id": "e-1", "value": "text"}     "value": null makes it EOF
    {"type": "interrupt", "id": "e-1"}
    {"type": "checkpoint", "id": "c-1", "path": "/dir/file", "background": true}
    {"type": "restore", "id": "r-1", "path": "/dir/file", "clear": true}
    {"type": "inspect", "id": "i-1"}
    {"type": "shutdown"}

Executions, checkpoints and restores run one at a time on the main thread, in arrival order.
An inspect or an interrupt is handled at once by the thread that reads the requests, also while
code runs.
An input_reply counts only while an input() of that execution waits for one; other replies,
and messages of unknown types, are ignored.

Worker -> host:

    {"type": "hello", "protocol": 1, "pid": 1234, "python_version": "3.11.7",
     "executable": "/usr/bin/python3"}                          once, when ready for requests
    {"type": "input_request", "id": "e-1", "prompt": "Name: ", "password": false}
    {"type": "display", "id": "e-1", "mime": "image/png", "data": "<base64>"}
    {"type": "result", "id": "e-1", "status": "ok" | "error",
     "result": {"repr": "4", "type": "int"} | null,
     "error": {"type": "KeyError", "message": "'x'", "traceback": ["..."]} | null,
     "changed": true, "rolled_back": false}
    {"type": "checkpoint_done", "id": "c-1", "bytes": 5120, "saved": ["df", "f", "np"],
     "lost": [{"name": "sock", "reason": "TypeError: cannot pickle 'socket' object"}],
     "error": null | "why no file was written"}
    {"type": "restore_done", "id": "r-1", "restored": ["np", "f", "df"], "lost": [...],
     "error": null | "why the file could not be read"}
    {"type": "inspect_done", "id": "i-1",
     "variables": [{"name": "df", "type": "pandas.core.frame.DataFrame", "size_bytes": 2400}],
     "definitions": [{"name": "f", "kind": "function" | "class" | "lambda", "source": "..."}],
     "rss_bytes": 31457280 | null}

Every execute request gets exactly one result, after its input requests and displays.
"result" is set when the code ends with an expression statement whose value is not None, as at
the interactive prompt: its repr() cut to repr_limit UTF-8 bytes (ending in "…" when cut), the
name of its type and, when the value has ``_repr_html_``, its HTML as "html". "error" holds the
exception's class name, str() and traceback.format_exception() lines without the worker's own
frames; SystemExit and KeyboardInterrupt are errors like the others, and the worker goes on
serving. The error type "WorkerError" marks a fault of the worker itself. A display's data is
base64 for image/png and text for image/svg+xml, text/html and text/plain.

"changed" says whether the execution may have changed the namespace, for the host to debounce
its automatic checkpoints: true when a name was added, removed or rebound, or when the code
contains a call, an assignment (=, +=, :=, annotated), del, import, def, class, global,
nonlocal, await, or a with, for or while statement, any of which could change an object in
place; false for a pure expression such as ``x``, ``1 + 2`` or ``x.shape``. It can be true for
code that changed nothing (a keyword in a string, say), never false for code that did, short
of a property or __getattr__ with side effects.

Transactions: with "rollback_on_failure", an execution that fails (any error, SystemExit and
KeyboardInterrupt included) leaves the namespace as it was, and its result says "rolled_back":
true. Before the code runs, the worker keeps a shallow copy of the namespace dict and, for each
name the code can reach, a copy of its value: copy.deepcopy(), or a pickle when that fails. The
names the code can reach are every Name of its AST at any depth, plus, transitively, the global
names that the session's functions and classes among them use (the co_names of their code and
of the code nested in it). When the code fails, the names it created are removed, those it
deleted or rebound are bound to their old objects again, and the reachable names get their
copies, which undoes in-place mutations (``lst.append(1); raise ValueError`` leaves lst as it
was). When it succeeds the copies are dropped. The cost is a copy of the data the code can
reach, not of the namespace: for a cell that touches a 100 MB array, 40 to 90 ms and 100 MB
more memory while it runs (as much as copying the array); for one that does not, some µs.
Not undone: a value that can be neither deep-copied nor pickled (a socket, a generator) stays
as the code left it, and the error is reported as it was; objects that referred to a
rolled-back value still see the original, which the code may have mutated; values reached only
through strings (``globals()["x"]``); changes outside the namespace (files, sys.modules, the
state of imported modules, closures and default values of functions).

Checkpoints save the namespace to the file at "path" (created with mode 0600), each name on its
own (two names that share an object restore as two objects), dunder names left out. A module
is saved as an import: ``import numpy as np`` restores as such, and so does ``from os import
path``. Functions, classes and lambdas that the session defined at the top level of a cell
(``def``, ``async def`` and ``class`` statements with their decorators, ``name = lambda ...``
assignments) and that are still bound to their name are saved as their source, and run again on
restore, so that they restore even when pickle cannot take them. Any other value is pickled,
protocol 5, by cloudpickle or else dill when one of them can be imported, else by pickle; the
session's definitions in it are pickled by reference, so that an instance of a session class
restores as an instance of the restored class. A name that cannot be saved (an open socket, a
generator) is reported in "lost" with the reason; "error" is set only when no file could be
written. With "background": true the worker forks, and the child writes the file from its
copy-on-write copy of the namespace while the worker goes on serving: checkpoint_done comes when
the child is done, maybe after the results of later executions. The child writes nothing to fds
1, 2 and 4: it sends its report (the JSON of checkpoint_done's fields) to the worker through a
pipe. When fork() fails, or when the last checkpoint was at most 4 MiB (writing it at once takes
a few milliseconds, less than a child's copy-on-write faults cost), the checkpoint is written at
once, as without "background".

The file, which only the worker reads: 8 bytes b"PYVCKPT1"; for each pickled value, its pickle
stream followed by its out-of-band buffers (pickle protocol 5 buffers of 64 KiB or more, such as
numpy's and pandas' data) as raw bytes; the index, a pickle of {"format": 1, "pickler": name,
"imports": [(name, module)], "sources": [(name, kind, source)], "values": [(name, offset,
length, [buffer sizes])]}; and the index's offset as 8 bytes big-endian.

Restores: with "clear", the session's names (not the dunder ones) are removed first. Then the
imports, the sources (run in the namespace, in the order they were first defined) and the values
are restored, in that order. A name whose restore fails is tried again after the others as long
as that brings something more back (a class body may use a value), then reported in "lost";
"error" is set only when the file cannot be read at all. Restored definitions keep their source,
for later checkpoints and for inspect.

Inspect: "variables" are the namespace's names, sorted, but the dunder ones, with the qualified
name of their value's type and its approximate size: nbytes for numpy values, memory_usage()
for pandas ones (deep up to 100,000 rows), sys.getsizeof() for others, one level deep for
lists, tuples, sets and dicts (extrapolated from their first 100,000 items); null when it cannot
be had. "definitions" are those that a checkpoint would save as source; "rss_bytes" comes from
/proc/self/statm.

What the code sees: one namespace for the whole session, the dict of a fresh ``__main__``
module (so pickle finds what the code defines); each execution compiled as ``<cell-N>``, its
source in linecache for tracebacks; ``display(*objs)`` as a builtin, sending the richest of
_repr_png_, _repr_svg_, _repr_html_ and repr() of each object; input() and getpass.getpass()
asking the client (EOFError when no execution is running); pyplot figures still open at the end
of an execution sent as PNG displays and closed (MPLBACKEND defaults to Agg). A process that
the code forks without exec never writes to fd 4, and exits if it returns into the worker.

Ordering: before writing any frame, the worker flushes sys.stdout and sys.stderr (and the
original ones, should the code have replaced them), so all that the code printed before a frame
is in the fd 1/2 pipes when the frame arrives. The worker itself never writes to fds 1 and 2.

Interrupts: the host sends an interrupt naming the execution, not a signal, so that an
interrupt sent as soon as the execute request is written is not lost while the execution waits
for the main thread, and a late one never reaches the next execution. When that execution runs
and has not been interrupted yet, the reader thread sends SIGINT to the main thread: it raises
KeyboardInterrupt in the session's code, also inside blocking calls such as time.sleep() and
input(), and in the repr() of the result; while the code has a frame written (display(),
input()) it is held back until the frame is whole. When the worker has the execution but has
not started it, the execution ends with a KeyboardInterrupt error as soon as the main thread
takes it up, without running any code. An interrupt of an execution that has finished, or that
the worker never received, is ignored. A SIGINT from elsewhere (the code's own os.kill()) raises
KeyboardInterrupt in the running code too, and is ignored while no code runs.

Exit status: 0 after a shutdown request or when the host closes its end of fd 3 or fd 4; 1 when
the protocol stream is corrupt or its fds are unusable, or a preload module fails to import.

Preload: ``worker.py --preload pandas,numpy`` imports those modules before the hello, so that
the session's code finds them in sys.modules. When one fails to import, the worker writes a
line naming it to fd 2 and exits with status 1 before saying hello. sys.argv is cut back to the
script alone, so the code sees the same sys.argv however the worker was started.

Zygote mode: ``worker.py --zygote --preload pandas`` makes this process a fork server for
workers with those modules imported. Its fd 3 is a Unix SOCK_SEQPACKET socket to the host; its
fds 0, 1 and 2 are /dev/null. Each message is one datagram holding one JSON object, unframed.
The zygote imports the modules, compiles once (the first compile() of a process is slow), stops
the garbage collector and freezes what it has (gc.freeze(), so the children's collections
leave the shared pages alone), then serves the host, single-threaded: forking a process that
has threads is unsafe. Host -> zygote:

    {"type": "fork", "id": 1, "cwd": "/dir" | null, "env": [["NAME", "value"]],
     "rlimits": [{"resource": "nofile", "soft": 256, "hard": 256}]}

with the child's fds 0-4 (stdin, stdout, stderr, request pipe, reply pipe) attached as
SCM_RIGHTS. A "resource" is the lowercase name of an RLIMIT_* constant. Zygote -> host:

    {"type": "ready", "pid": 1200}                       once, when forks can be served
    {"type": "failed", "reason": "..."}                  the zygote cannot go on; it exits 1
    {"type": "forked", "id": 1, "pid": 1234}
    {"type": "fork_failed", "id": 1, "reason": "..."}
    {"type": "exited", "pid": 1234, "status": 9}         raw wait status of a reaped child

The "exited" of a child always comes after its "forked" (the host ignores exits of children
it was never told of: a spare, below, that died unused). The zygote reaps its children on
SIGCHLD, which wakes its poll loop through signal.set_wakeup_fd(). It exits 0 when the host
closes the socket; the children it forked live on. To take the fork itself out of a request's
time, the zygote forks one child ahead (the spare), which waits on a socketpair of its own: on
a request, the zygote replies "forked" with the spare's pid, passes the request on to it, and
forks the next spare. A request that finds no spare forks its child itself.

A forked child puts itself in its own process group (the zygote does too, for the child, so
that the group exists when "forked" is sent), moves the five fds onto 0-4, closes every other
fd, sets the rlimits, working directory and environment, restores the signal handling of a
fresh worker and turns the garbage collector back on. Then it waits for one frame on fd 3:

    {"type": "start"}

which the host sends once it has registered the child for cleanup and put it in its cgroup, so
that no code runs before the child is contained; end of file instead (the host gave up or
died) makes it exit 0. From there on it is a worker like any other: it says hello and serves.
"""

import _thread
import ast
import base64
import builtins
import getpass
import io
import json
import linecache
import operator
import os
import queue
import re
import signal
import struct
import sys
import threading
import time
import traceback
import types

PROTOCOL_VERSION = 1
REQUEST_FD = 3
REPLY_FD = 4
MAX_FRAME = 32 * 1024 * 1024
DEFAULT_REPR_LIMIT = 64 * 1024

# ---------------------------------------------------------------------------------------------
# Transport
# ---------------------------------------------------------------------------------------------

_HEADER = struct.Struct(">I")
_encode = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":")).encode
_decode = json.JSONDecoder().decode
_write_lock = threading.Lock()
_MAIN_THREAD = threading.get_ident()

# What the SIGINT handler does: "raise" while the session's code runs on the main thread,
# "defer" while that code has the main thread write a frame, "ignore" otherwise.
_sigint_action = "ignore"
_sigint_deferred = False
# Whether the handler has run since the running execution was interrupted.
_sigint_seen = False


def _on_sigint(signum, frame):
    """SIGINT handler: interrupt the session's code, never the worker's own work."""
    global _sigint_deferred, _sigint_seen
    _sigint_seen = True
    if _sigint_action == "raise":
        raise KeyboardInterrupt
    if _sigint_action == "defer":
        _sigint_deferred = True


def _flush_output():
    """Flush the code's output streams, ignoring any that the code replaced or broke."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def _exit_worker(status):
    """End the worker process now, with the code's output flushed."""
    _flush_output()
    os._exit(status)


def _send(message):
    """Write `message` to the host as one frame, after flushing the code's output."""
    global _sigint_action, _sigint_deferred
    payload = _encode(message).encode("utf-8", "replace")
    while len(payload) > MAX_FRAME:
        message = _stand_in(message, len(payload))
        payload = _encode(message).encode("utf-8", "replace")
    frame = _HEADER.pack(len(payload)) + payload
    _flush_output()
    if _sigint_action == "raise" and threading.get_ident() == _MAIN_THREAD:
        # The session's code is writing (display(), input()): a KeyboardInterrupt must not cut
        # the frame short, so it is raised once the frame is whole.
        _sigint_action = "defer"
        try:
            _write_frame(frame)
        finally:
            _sigint_action = "raise"
        if _sigint_deferred:
            _sigint_deferred = False
            raise KeyboardInterrupt
    else:
        _write_frame(frame)


def _write_frame(frame):
    """Write all of `frame` to fd 4; exits the worker when that fails."""
    with _write_lock:
        try:
            written = os.write(REPLY_FD, frame)
            if written < len(frame):  # a signal cut the write short
                rest = memoryview(frame)[written:]
                while rest:
                    rest = rest[os.write(REPLY_FD, rest):]
        except BrokenPipeError:
            _exit_worker(0)
        except OSError:
            _exit_worker(1)


def _stand_in(message, size):
    """A smaller message to send instead of `message`, whose frame would take `size` bytes."""
    kind = message["type"]
    note = "[pyvisor] %s of %d bytes exceeds the %d-byte frame limit" % (kind, size, MAX_FRAME)
    if kind == "display":
        return dict(message, mime="text/plain", data=note)
    if kind == "input_request":
        return dict(message, prompt=note)
    if kind != "result":  # checkpoint_done, restore_done, inspect_done: keep half of each list
        return {key: value[: len(value) // 2] if isinstance(value, list) else value
                for key, value in message.items()}
    result = message["result"]
    if result is not None and "html" in result:
        return dict(message, result={"repr": result["repr"], "type": result["type"]})
    error = {"type": "WorkerError", "message": note, "traceback": []}
    return dict(message, status="error", result=None, error=error)


def _read_exact(size):
    """The next `size` bytes of fd 3; exits the worker when the host has closed it."""
    try:
        data = os.read(REQUEST_FD, size)
        if len(data) < size:  # a large frame comes through the pipe in pieces
            buffer = bytearray(data)
            while data and len(buffer) < size:
                data = os.read(REQUEST_FD, size - len(buffer))
                buffer += data
            data = buffer
    except OSError:
        _exit_worker(1)
    if len(data) < size:
        _exit_worker(0)
    return data


def _read_message():
    """The next message from the host; None for a frame that holds no JSON object."""
    (size,) = _HEADER.unpack(_read_exact(_HEADER.size))
    if size > MAX_FRAME:
        _exit_worker(1)
    try:
        message = _decode(_read_exact(size).decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def _start_thread(function, *args):
    """Start a thread that runs `function(*args)` with every signal blocked.

    The kernel then delivers a SIGINT (and any signal the code waits for) to the main
    thread, waking it from blocking calls. The thread is not waited for (threading.Thread.start()
    would wait about a millisecond for it to be scheduled).
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        _thread.start_new_thread(function, args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


# The reader thread's outputs: execute, checkpoint and restore requests for the main loop, and
# answers (None meaning end of file) for the input() waiting for one.
_requests = queue.SimpleQueue()
_input_replies = queue.SimpleQueue()


def _read_requests():
    """Reader thread: route every message from the host, also while the code runs."""
    while True:
        message = _read_message()
        if message is None:
            continue
        kind = message.get("type")
        if kind == "execute":
            execution_id = message.get("id")
            if type(execution_id) is str:
                with _execution_lock:
                    _waiting[execution_id] = False
            _requests.put(message)
        elif kind in ("checkpoint", "restore"):
            _requests.put(message)
        elif kind == "interrupt":
            _interrupt(message.get("id"))
        elif kind == "inspect":
            _send(_inspect(message))
        elif kind == "input_reply":
            waiting_for = _input_waiting_for
            if waiting_for is not None and message.get("id") == waiting_for:
                value = message.get("value")
                _input_replies.put(value if isinstance(value, str) else None)
        elif kind == "shutdown":
            _exit_worker(0)


# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------

# The session's __main__ module: its dict is the namespace every cell runs in.
_session = types.ModuleType("__main__")
_session.__builtins__ = builtins
_namespace = _session.__dict__
_WORKER_FILE = _on_sigint.__code__.co_filename

_cell_count = 0
# Which execution runs and which wait for the main thread, for the reader thread to route an
# interrupt (see Interrupts in the docstring); the main thread changes _current_id under the
# lock, which the reader thread holds from its check to its SIGINT.
_execution_lock = threading.Lock()
_current_id = None  # id of the running execution; other threads read it
_current_interrupted = False  # the running execution has had its SIGINT
_waiting = {}  # id of each execution received and not yet taken up -> whether it is interrupted
_input_waiting_for = None  # id of the execution whose input() waits for an answer
_input_lock = threading.Lock()
_forked = False  # this process is a child that the session's code forked
_MISSING = object()  # the value of a name that is not bound

# The functions, classes and lambdas that the session's cells (or a restore) defined, by name,
# in the order they were last defined: name -> (kind, source, value). A record counts only while
# its name is still bound to its value; the reader thread reads it for inspect.
_definitions = {}


def _interrupt(execution_id):
    """Reader thread: interrupt the execution `execution_id` if it runs or waits, else nothing."""
    global _current_interrupted
    if type(execution_id) is not str:
        return
    global _sigint_seen
    with _execution_lock:
        if execution_id == _current_id:
            if not _current_interrupted:
                _current_interrupted = True
                _sigint_seen = False
                # To the main thread itself, which the code may block in a system call.
                signal.pthread_kill(_MAIN_THREAD, signal.SIGINT)
                _start_thread(_repeat_interrupt, execution_id)
        elif execution_id in _waiting:
            _waiting[execution_id] = True


def _repeat_interrupt(execution_id):
    """Thread: send the SIGINT of `execution_id` again while its handler has not run.

    A SIGINT that lands after the main thread's last check for signals but before it enters a
    blocking system call (time.sleep() just about to sleep) only marks the handler as due: the
    call then blocks, and the handler would run when it returns. Seen under load about once in
    a hundred immediate interrupts. A second SIGINT interrupts the blocked call. Once the
    handler has run, nothing is sent again, so code that catches the KeyboardInterrupt is
    interrupted once, as asked.
    """
    for _ in range(100):
        time.sleep(0.02)
        with _execution_lock:
            if execution_id != _current_id or _sigint_seen:
                return
            signal.pthread_kill(_MAIN_THREAD, signal.SIGINT)


def _execute(request):
    """Run one execute request in the session namespace; return its result message."""
    global _cell_count, _current_id, _current_interrupted, _sigint_action
    execution_id = request.get("id")
    code = request.get("code")
    repr_limit = request.get("repr_limit", DEFAULT_REPR_LIMIT)
    transaction = request.get("transaction", "commit_always")
    if (not isinstance(code, str) or not isinstance(repr_limit, int)
            or transaction not in ("commit_always", "rollback_on_failure")):
        if type(execution_id) is str:
            with _execution_lock:
                _waiting.pop(execution_id, None)
        problem = "execute request %r needs a code string, an int repr_limit and a transaction"
        raise TypeError(problem % (execution_id,))
    _cell_count += 1
    filename = "<cell-%d>" % _cell_count
    # Tracebacks, inspect and pdb read a cell's source from linecache, as they do a file's.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    cell = _Cell(code, filename)
    watch = _Watch(cell, rollback=transaction == "rollback_on_failure")
    try:
        with _execution_lock:  # taken up: from here on, an interrupt of it is a SIGINT
            interrupted = type(execution_id) is str and _waiting.pop(execution_id, False)
            if not interrupted:
                _current_id = execution_id
                _current_interrupted = False
                _sigint_action = "raise"
        if interrupted:  # before it started: it ends without running any code
            raise KeyboardInterrupt
        watch.before_run()  # part of the execution: a SIGINT stops a long snapshot too
        value, error = _run_cell(cell, repr_limit), None
    except BaseException as exc:
        value, error = None, exc
    finally:
        _sigint_action = "ignore"  # first: a SIGINT on its way from here on is ignored
        with _execution_lock:
            _current_id = None
        if _input_waiting_for is not None:
            _input_replies.put(None)  # an input() on another thread outlived its execution
    if _forked:
        # A process that the code forked has come back here: it ends as a script would.
        _exit_worker(0 if error is None else 1)
    changed, rolled_back = watch.after_run(error)
    _show_open_figures(execution_id)
    if error is None:
        return _result(execution_id, value, None, changed)
    if isinstance(error, SystemExit):
        _reopen_stdin()
    error = _describe_error(error, repr_limit)
    return _result(execution_id, None, error, changed, rolled_back)


def _result(execution_id, value, error, changed, rolled_back=False):
    """The result message of an execution."""
    return {
        "type": "result",
        "id": execution_id,
        "status": "ok" if error is None else "error",
        "result": value,
        "error": error,
        "changed": changed,
        "rolled_back": rolled_back,
    }


class _Cell:
    """The code of one execution, parsed to an AST only when something needs the tree."""

    __slots__ = ("code", "filename", "_tree")

    def __init__(self, code, filename):
        self.code = code
        self.filename = filename
        self._tree = None

    @property
    def parsed(self):
        return self._tree is not None

    @property
    def tree(self):
        """The cell's AST; raises SyntaxError (ValueError for a NUL byte) as compile() does."""
        if self._tree is None:
            flags = ast.PyCF_ONLY_AST
            self._tree = compile(self.code, self.filename, "exec", flags, dont_inherit=True)
        return self._tree


def _run_cell(cell, repr_limit):
    """Run `cell`; describe the value of a final expression statement, if any."""
    code, filename = cell.code, cell.filename
    if not cell.parsed:  # _Watch.before_run() parses every cell that may end with an expression
        exec(compile(code, filename, "exec", dont_inherit=True), _namespace)
        return None
    body = cell.tree.body
    if not body or type(body[-1]) is not ast.Expr:
        exec(compile(cell.tree, filename, "exec", dont_inherit=True), _namespace)
        return None
    if len(body) > 1:
        head = ast.Module(body[:-1], type_ignores=[])
        exec(compile(head, filename, "exec", dont_inherit=True), _namespace)
    expression = compile(ast.Expression(body[-1].value), filename, "eval", dont_inherit=True)
    value = eval(expression, _namespace)
    if value is None:
        return None
    result = {"repr": _clip(repr(value), repr_limit), "type": type(value).__name__}
    html = _call_repr_method(value, "_repr_html_")
    if isinstance(html, str):
        result["html"] = html
    return result


# The start of a simple statement that is not an expression: an assignment, an augmented
# assignment, or a statement that begins with a keyword.
_NOT_AN_EXPRESSION = re.compile(
    r"[A-Za-z_][\w.]*\s*(?:[-+*/%@&|^]|//|\*\*|<<|>>)?=(?!=)"
    r"|(?:assert|async|break|class|continue|def|del|for|from|global|if|import|nonlocal|pass"
    r"|raise|return|try|while|with)\b"
)


def _may_end_with_expression(code):
    """False when a look at its last line proves that `code` does not end with an expression.

    This spares the common cell that ends with an assignment or an import the parse to an AST,
    which costs about as much again as compiling it.
    """
    code = code.rstrip()
    start = code.rfind("\n") + 1
    last = code[start:]
    if not _NOT_AN_EXPRESSION.match(last):
        return True
    # The last line holds just that statement (no ";") unless it continues earlier lines: then
    # it closes a bracket or a string opened there, or follows a backslash.
    return (
        ";" in last
        or "'" in last
        or '"' in last
        or "\r" in last
        or last.count("(") != last.count(")")
        or last.count("[") != last.count("]")
        or last.count("{") != last.count("}")
        or (start > 0 and code.endswith(("\\", "\\\r"), 0, start - 1))
    )


def _clip(text, limit):
    """`text` cut to at most `limit` UTF-8 bytes, ending in "…" when cut."""
    if len(text) * 4 <= limit:  # no character takes more than 4 bytes
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[: max(limit - 3, 0)].decode("utf-8", "ignore") + "…"


def _describe_error(exc, limit):
    """The "error" object of a result, for an exception raised by the session's code."""
    if isinstance(exc, SyntaxError) and exc.text is None and exc.filename and exc.lineno:
        # Errors found after parsing ('return' outside function, ...) come without the line.
        exc.text = linecache.getline(exc.filename, exc.lineno) or None
    try:
        message = str(exc)
    except Exception:
        message = "<exception str() failed>"
    lines = [_clip(line, limit) for line in _user_traceback(exc)]
    return {"type": type(exc).__name__, "message": _clip(message, limit), "traceback": lines}


def _user_traceback(exc):
    """traceback.format_exception() of `exc`, without the worker's own frames."""
    top = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    pending = [top]
    while pending:
        summary = pending.pop()
        frames = [frame for frame in summary.stack if frame.filename != _WORKER_FILE]
        summary.stack = traceback.StackSummary.from_list(frames)
        pending.extend(chained for chained in (summary.__cause__, summary.__context__) if chained)
        pending.extend(getattr(summary, "exceptions", None) or ())  # exception groups, 3.11+
    return list(top.format())


def _worker_error(exc):
    """The "error" object of a result, for a fault of the worker itself."""
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return {
        "type": "WorkerError",
        "message": "internal error in the pyvisor worker: " + summary,
        "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__),
    }


def _reopen_stdin():
    """exit() closes sys.stdin on its way out; give later cells a fresh reader of fd 0."""
    if sys.stdin is sys.__stdin__ and getattr(sys.stdin, "closed", False):
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)


# --- what a cell changes: "changed", transactions, definitions --------------------------------

# The nodes of code that could change an object in place or a binding.
_MUTATING_NODES = frozenset((
    ast.Call, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.Delete, ast.Import,
    ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Global,
    ast.Nonlocal, ast.Await, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While,
))

# Text without which code has none of those nodes: a call, an "=" that is not part of a
# comparison, or a keyword. It spares most cells a parse to tell whether they could mutate.
_MUTATION_HINT = re.compile(
    r"[\w)\]]\s*\(|(?<![=!<>])=(?!=)|<<=|>>="
    r"|\b(?:import|del|def|class|global|nonlocal|await|with|for|while)\b"
)

# Text without which code defines no function, class or lambda.
_DEFINES = re.compile(r"\b(?:def|class|lambda)\b")

# Values that a rollback does not need to copy: immutable, or restored by rebinding the name.
_NOT_COPIED = (
    type(None), bool, int, float, complex, str, bytes, range, type, types.ModuleType,
    types.FunctionType, types.BuiltinFunctionType,
)


class _Watch:
    """What one execution does to the namespace: whether it changes it, which definitions it
    makes, and with a rollback_on_failure transaction how to undo it (see the docstring)."""

    __slots__ = (
        "cell", "rollback", "started", "may_mutate", "bindings", "candidates", "before", "copies",
        "pickles", "uncopied",
    )

    def __init__(self, cell, rollback):
        self.cell = cell
        self.rollback = rollback
        self.started = False  # before_run() is done, the code itself runs
        self.may_mutate = True  # the code could mutate an object or rebind a name
        self.bindings = None  # the names and values before the code ran, if may_mutate is False
        self.candidates = {}  # the cell's definitions: name -> (kind, source, value before)
        self.before = None  # rollback: the namespace dict before the code ran
        self.copies = {}  # rollback: name -> copy of its value before the code ran
        self.pickles = {}  # rollback: name -> pickle of it, when deepcopy() failed
        self.uncopied = False  # rollback: some reachable value could be neither

    def before_run(self):
        """Keep what after_run() needs; this runs as part of the execution."""
        cell = self.cell
        defines = _DEFINES.search(cell.code) is not None
        if self.rollback or defines or _may_end_with_expression(cell.code):
            cell.tree  # parsed now, and _run_cell() compiles the tree: parsed once
        if _MUTATION_HINT.search(cell.code) is None:
            self.may_mutate = False
        elif cell.parsed:
            self.may_mutate = _has_mutating_node(cell.tree)
        if not self.may_mutate:
            # Held for the run of code that deletes nothing, compared by identity after it.
            self.bindings = list(_namespace), list(_namespace.values())
        if defines:
            self.candidates = {
                name: (kind, source, _namespace.get(name, _MISSING))
                for name, (kind, source) in _definitions_in(cell).items()
            }
        if self.rollback:
            self.before = dict(_namespace)
            self._copy_reachable()
        self.started = True

    def after_run(self, error):
        """(changed, rolled_back) once the code has run, and failed with `error` unless None."""
        if self.rollback and error is not None:
            if self.started:  # else the code did not run, and changed nothing
                self._roll_back()
            return self.uncopied and self.may_mutate, True
        if not self.started:  # it did not parse: nothing ran
            return False, False
        for name, (kind, source, old) in self.candidates.items():
            value = _namespace.get(name, _MISSING)
            if value is not _MISSING and value is not old:  # this cell bound it
                _definitions.pop(name, None)
                _definitions[name] = (kind, source, value)
        changed = self.may_mutate or _rebound(*self.bindings)
        if changed and _definitions:
            for name, (_, _, value) in list(_definitions.items()):
                if _namespace.get(name, _MISSING) is not value:
                    del _definitions[name]
        return changed, False

    def _copy_reachable(self):
        """Copy the value of every name the cell can reach, as it is before the cell runs."""
        import copy

        memo = {}  # one memo for all: names that share an object share its copy
        for name in _reachable_names(self.cell.tree):
            value = self.before.get(name, _MISSING)
            if value is _MISSING or isinstance(value, _NOT_COPIED):
                continue
            try:
                if type(value) is bytearray:  # deepcopy() would go through bytes: 4 times slower
                    self.copies[name] = memo.setdefault(id(value), bytearray(value))
                else:
                    self.copies[name] = copy.deepcopy(value, memo)
            except Exception:
                try:
                    import pickle

                    self.pickles[name] = pickle.dumps(value, protocol=5)
                except Exception:
                    self.uncopied = True

    def _roll_back(self):
        """Put the namespace back as it was before the cell ran."""
        namespace, before = _namespace, self.before
        for name in [name for name in namespace if name not in before]:
            del namespace[name]
        for name, value in before.items():
            if namespace.get(name, _MISSING) is not value:
                namespace[name] = value
        namespace.update(self.copies)
        for name, data in self.pickles.items():
            try:
                import pickle

                namespace[name] = pickle.loads(data)
            except Exception:  # left as the code left it
                pass


def _has_mutating_node(tree):
    """Whether the AST `tree` has one of _MUTATING_NODES; quicker than a walk of ast.walk()."""
    pending = [tree]
    while pending:
        node = pending.pop()
        if type(node) in _MUTATING_NODES:  # quicker than isinstance() with 19 classes
            return True
        for field in getattr(node, "_fields", ()):  # not AST nodes (names, None) have none
            child = getattr(node, field, None)
            if type(child) is list:
                pending.extend(child)
            elif isinstance(child, ast.AST):
                pending.append(child)
    return False


def _rebound(names, values):
    """Whether the namespace has names other than `names`, or other `values` for them."""
    return (
        len(_namespace) != len(names)
        or list(_namespace) != names
        or not all(map(operator.is_, values, _namespace.values()))
    )


def _is_user_name(name):
    """Whether `name` is one of the session's own names, not a dunder such as __builtins__."""
    return type(name) is str and not (name.startswith("__") and name.endswith("__"))


def _definitions_in(cell):
    """The definitions at the top level of `cell`: name -> (kind, source).

    A name that a later statement of the cell binds again is left out.
    """
    found = {}
    for statement in cell.tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kind = "class" if isinstance(statement, ast.ClassDef) else "function"
            # The source from the first decorator on: top-level statements start a line.
            first = min([statement.lineno] + [node.lineno for node in statement.decorator_list])
            span = types.SimpleNamespace(
                lineno=first,
                col_offset=0,
                end_lineno=statement.end_lineno,
                end_col_offset=statement.end_col_offset,
            )
            found[statement.name] = (kind, ast.get_source_segment(cell.code, span))
            continue
        targets = getattr(statement, "targets", None) or [getattr(statement, "target", None)]
        if (
            isinstance(statement, (ast.Assign, ast.AnnAssign))
            and len(targets) == 1
            and isinstance(targets[0], ast.Name)
            and isinstance(statement.value, ast.Lambda)
        ):
            found[targets[0].id] = ("lambda", ast.get_source_segment(cell.code, statement))
            continue
        for node in ast.walk(statement):  # whatever else the statement binds
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                found[node.id] = None
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = None
            elif isinstance(node, ast.alias):
                found[(node.asname or node.name).partition(".")[0]] = None
    return {name: definition for name, definition in found.items() if definition is not None}


def _reachable_names(tree):
    """The names that code of AST `tree` can reach (see Transactions in the docstring)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    pending, seen = list(names), set()
    while pending:
        for code in _session_code(_namespace.get(pending.pop(), _MISSING)):
            for name in _global_names(code, seen):
                if name not in names and name in _namespace:
                    names.add(name)
                    pending.append(name)
    return names


def _session_code(value):
    """The code of the session's own functions that using `value` may run."""
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return [value.__code__] if value.__globals__ is _namespace else []
    codes = []
    for cls in (value if isinstance(value, type) else type(value)).__mro__:
        if cls.__dict__.get("__module__") != "__main__":
            continue
        for member in list(cls.__dict__.values()):
            if isinstance(member, (staticmethod, classmethod)):
                functions = [member.__func__]
            elif isinstance(member, property):
                functions = [member.fget, member.fset, member.fdel]
            else:
                functions = [member]
            codes.extend(
                function.__code__ for function in functions
                if isinstance(function, types.FunctionType) and function.__globals__ is _namespace
            )
    return codes


def _global_names(code, seen):
    """The names that `code` and the code nested in it use, leaving out code in `seen`."""
    names, pending = [], [code]
    while pending:
        code = pending.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        names.extend(code.co_names)
        pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return names


# --- display() and pyplot figures -------------------------------------------------------------

_RICH_MIMES = (
    ("image/png", "_repr_png_"),
    ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"),
)


def display(*objs):
    """Show each object in the client, in the richest format it offers (IPython's protocol)."""
    execution_id = _current_id
    if execution_id is None:  # no execution to show it in (a thread outliving its cell)
        return
    for obj in objs:
        mime, data = _display_data(obj)
        _send({"type": "display", "id": execution_id, "mime": mime, "data": data})


def _display_data(obj):
    """(mime, data) of the richest representation `obj` offers, repr() as the last resort."""
    figure_module = sys.modules.get("matplotlib.figure")
    if figure_module is not None and isinstance(obj, figure_module.Figure):
        try:
            return _figure_png(obj)
        except Exception:
            return "text/plain", repr(obj)
    for mime, method in _RICH_MIMES:
        data = _call_repr_method(obj, method)
        if isinstance(data, bytes) and mime == "image/png":
            return mime, base64.b64encode(data).decode("ascii")
        if isinstance(data, str):
            return mime, data
    return "text/plain", repr(obj)


def _call_repr_method(obj, name):
    """What obj.<name>() returns; None when there is no such method or it fails."""
    if isinstance(obj, type):  # a class's _repr_*_ methods are for its instances
        return None
    try:
        method = getattr(obj, name, None)
        data = method() if callable(method) else None
    except Exception:
        return None
    if isinstance(data, tuple) and data:  # IPython also allows (data, metadata)
        data = data[0]
    return data


def _figure_png(figure):
    """A matplotlib figure as the (mime, data) of a PNG display."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return "image/png", base64.b64encode(buffer.getvalue()).decode("ascii")


def _show_open_figures(execution_id):
    """Send the pyplot figures that the execution left open as PNG displays; close them."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        figures = [pyplot.figure(number) for number in pyplot.get_fignums()]
        pyplot.close("all")
    except Exception as exc:
        figures = []
        _send_note(execution_id, "could not collect the open pyplot figures", exc)
    for figure in figures:
        try:
            mime, data = _figure_png(figure)
        except Exception as exc:
            _send_note(execution_id, "could not render %r" % (figure,), exc)
        else:
            _send({"type": "display", "id": execution_id, "mime": mime, "data": data})


def _send_note(execution_id, what, exc):
    """Tell the client in a text/plain display that the worker failed to do `what`."""
    data = "[pyvisor] %s: %s: %s" % (what, type(exc).__name__, exc)
    _send({"type": "display", "id": execution_id, "mime": "text/plain", "data": data})


# --- input() and getpass() --------------------------------------------------------------------


def _input(prompt=""):
    """input() for the session's code: the client shows the prompt and answers the line."""
    return _ask(str(prompt), False)


def _getpass(prompt="Password: ", stream=None):
    """getpass.getpass() for the session's code: the client asks without echoing."""
    return _ask(str(prompt), True)


def _ask(prompt, password):
    """Send an input request for the running execution; return the client's answer."""
    global _input_waiting_for
    with _input_lock:
        while not _input_replies.empty():  # answers to earlier, interrupted requests
            _input_replies.get_nowait()
        execution_id = _input_waiting_for = _current_id
        try:
            # Checked after announcing the wait: an execution that ends from now on wakes us.
            if execution_id is None or _current_id != execution_id:
                raise EOFError("EOF when reading a line")
            _send({
                "type": "input_request",
                "id": execution_id,
                "prompt": prompt,
                "password": password,
            })
            value = _input_replies.get()
        finally:
            _input_waiting_for = None
    if value is None:
        raise EOFError("EOF when reading a line")
    return value


def _after_fork_in_child():
    """Keep a process that the session's code forked off the protocol pipes."""
    global _forked, _current_id, _execution_lock
    _forked = True
    _current_id = None
    _execution_lock = threading.Lock()  # the reader thread, not forked, may have held it


# --- main loop --------------------------------------------------------------------------------


def _serve():
    """Main loop: serve the execute, checkpoint and restore requests in arrival order."""
    while True:
        request = _requests.get()
        kind = request.get("type")
        try:
            if kind == "execute":
                reply = _execute(request)
            elif kind == "checkpoint":
                reply = _checkpoint(request)  # None: a forked child writes it, a thread replies
            else:
                reply = _restore(request)
        except BaseException as exc:
            reply = _fault_reply(request, exc)
        if reply is not None:
            _send(reply)


def _fault_reply(request, exc):
    """The reply to `request` when serving it failed with `exc`, a fault of the worker."""
    kind, request_id = request.get("type"), request.get("id")
    if kind == "execute":
        return _result(request_id, None, _worker_error(exc), changed=True)
    reason = _worker_error(exc)["message"]
    if kind == "checkpoint":
        return _checkpoint_done(request_id, _no_checkpoint(reason))
    return {"type": "restore_done", "id": request_id, "restored": [], "lost": [], "error": reason}


def main(preload=()):
    """Set the process up as a session's worker, say hello, and serve until told to stop."""
    for fd in (REQUEST_FD, REPLY_FD):
        try:
            os.set_inheritable(fd, False)  # keep them from os.system() and subprocesses
        except OSError:
            sys.exit("pyvisor worker: fd %d is not open (pyvisor passes pipes as fds 3 and 4)" % fd)
    os.environ.setdefault("MPLBACKEND", "Agg")
    failure = _preload(preload)
    if failure is not None:
        sys.exit("pyvisor worker: " + failure)
    signal.signal(signal.SIGINT, _on_sigint)
    sys.modules["__main__"] = _session
    builtins.input = _input
    builtins.display = display
    getpass.getpass = _getpass
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _start_thread(_read_requests)  # a frame that comes before it runs waits in the pipe
    _send({
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "pid": os.getpid(),
        "python_version": sys.version.split()[0],
        "executable": sys.executable,
    })
    _serve()


# ---------------------------------------------------------------------------------------------
# Checkpoints and restores
# ---------------------------------------------------------------------------------------------

_CHECKPOINT_MAGIC = b"PYVCKPT1"
_CHECKPOINT_FORMAT = 1
_TRAILER = struct.Struct(">Q")  # the offset of the index, at the end of the file
_OUT_OF_BAND_MIN = 64 * 1024  # smaller pickle buffers stay in the pickle stream
_REASON_LIMIT = 1024  # longest "reason" of a lost name, in bytes
_restore_count = 0  # restored sources are compiled as <restored-N>


def _checkpoint(request):
    """Serve a checkpoint request; None when a forked child writes it and a thread replies."""
    checkpoint_id, path = request.get("id"), request.get("path")
    if not isinstance(path, str):
        raise TypeError("checkpoint request %r needs a path string" % (checkpoint_id,))
    global _last_checkpoint_bytes
    _pickler_base()  # imported here, not in every forked child
    # A small namespace is written faster at once than by a child, whose writes copy every
    # page it touches; the size of the last checkpoint tells which this one is likely to be.
    small = _last_checkpoint_bytes is not None and _last_checkpoint_bytes <= _INLINE_CHECKPOINT_BYTES
    if request.get("background") and not small and _checkpoint_in_child(checkpoint_id, path):
        return None
    report = _write_checkpoint(path)
    _last_checkpoint_bytes = report["bytes"]
    return _checkpoint_done(checkpoint_id, report)


# Checkpoints up to this size are written by the worker itself, larger ones by a forked child.
_INLINE_CHECKPOINT_BYTES = 4 * 1024 * 1024
# Size of the last checkpoint this worker wrote, None before the first.
_last_checkpoint_bytes = None


def _checkpoint_done(checkpoint_id, report):
    """The checkpoint_done message of a report (bytes, saved, lost, error)."""
    return {"type": "checkpoint_done", "id": checkpoint_id, **report}


def _no_checkpoint(error):
    """The report of a checkpoint that wrote no file."""
    return {"bytes": 0, "saved": [], "lost": [], "error": error}


def _lost(name, exc):
    """A "lost" entry: `name`, and the reason that `exc` (an exception or a text) gives."""
    if isinstance(exc, BaseException):
        try:
            exc = "%s: %s" % (type(exc).__name__, exc)
        except Exception:
            exc = type(exc).__name__
    return {"name": name, "reason": _clip(exc, _REASON_LIMIT)}


def _checkpoint_in_child(checkpoint_id, path):
    """Fork a child that writes the checkpoint from its copy of the namespace, and a thread that
    replies when the child is done; False when fork() fails."""
    try:
        report_read, report_write = os.pipe()
    except OSError:
        return False
    try:
        if sys.version_info < (3, 12):
            pid = os.fork()
        else:  # which warns of fork() in a process with threads, on the code's stderr
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
    except OSError:
        os.close(report_read)
        os.close(report_write)
        return False
    if pid == 0:
        os.close(report_read)
        _checkpoint_child(path, report_write)
    os.close(report_write)
    _start_thread(_await_checkpoint_child, checkpoint_id, path, pid, report_read)
    return True


def _checkpoint_child(path, report_fd):
    """In the forked child: write the checkpoint, its report to `report_fd`, exit. Never returns.

    The child never writes a frame (the reader thread, which the child does not have, may have
    held the writer's lock at the fork), and nothing the session's code prints reaches the host.
    """
    status = 1
    try:
        for fd in (REQUEST_FD, REPLY_FD):
            os.close(fd)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
        import gc

        gc.disable()  # collections would only copy the shared pages
        report = _encode(_write_checkpoint(path)).encode("utf-8", "replace")
        with open(report_fd, "wb") as pipe:
            pipe.write(report)
        status = 0
    finally:
        os._exit(status)


def _await_checkpoint_child(checkpoint_id, path, pid, report_fd):
    """Thread: read the report of the checkpoint child `pid`, reap it, send checkpoint_done."""
    try:
        with open(report_fd, "rb") as pipe:
            data = pipe.read()  # until the child exits
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # the session's code reaped it
            status = 0
        try:
            report = _decode(data.decode("utf-8"))
        except ValueError:  # it died before its report was whole
            if os.WIFSIGNALED(status):
                how = "was killed by signal %d" % os.WTERMSIG(status)
            else:
                how = "exited with status %d" % os.WEXITSTATUS(status)
            _remove(path)  # what it wrote of it
            report = _no_checkpoint("the process writing the checkpoint " + how)
    except BaseException as exc:
        report = _no_checkpoint(_worker_error(exc)["message"])
    if report.get("error") is None:
        global _last_checkpoint_bytes
        _last_checkpoint_bytes = report.get("bytes")
    _send(_checkpoint_done(checkpoint_id, report))


def _remove(path):
    """Remove the file `path` if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _live_definitions():
    """The session's definitions still bound to their name: name -> (kind, source, value)."""
    return {
        name: record for name, record in list(_definitions.items())
        if _namespace.get(name, _MISSING) is record[2]
    }


def _write_checkpoint(path):
    """Save the namespace to the file `path`; the report of checkpoint_done."""
    import pickle

    definitions = _live_definitions()
    pickler_name, pickler = _session_pickler(definitions)
    sources = [(name, kind, source) for name, (kind, source, _) in definitions.items()]
    saved, lost, imports, values = list(definitions), [], [], []
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return _no_checkpoint("cannot create %s: %s" % (path, exc.strerror))
    try:
        with open(fd, "wb") as file:
            os.fchmod(fd, 0o600)
            file.write(_CHECKPOINT_MAGIC)
            for name, value in list(_namespace.items()):
                if not _is_user_name(name) or name in definitions:
                    continue
                if isinstance(value, types.ModuleType):
                    module = getattr(value, "__name__", None)
                    if isinstance(module, str) and sys.modules.get(module) is value:
                        imports.append((name, module))
                        saved.append(name)
                    else:
                        lost.append(_lost(name, "module %r is not importable by name" % module))
                    continue
                start = file.tell()
                buffers = []
                try:
                    pickler(file, buffers).dump(value)
                except BaseException as exc:  # the value's own code may raise anything
                    file.seek(start)
                    file.truncate()
                    lost.append(_lost(name, exc))
                    continue
                length = file.tell() - start
                for buffer in buffers:
                    file.write(buffer)
                values.append((name, start, length, [buffer.nbytes for buffer in buffers]))
                saved.append(name)
            index_at = file.tell()
            index = {
                "format": _CHECKPOINT_FORMAT,
                "pickler": pickler_name,
                "imports": imports,
                "sources": sources,
                "values": values,
            }
            pickle.dump(index, file, protocol=5)
            file.write(_TRAILER.pack(index_at))
            size = file.tell()
    except Exception as exc:
        _remove(path)
        return _no_checkpoint("cannot write %s: %s: %s" % (path, type(exc).__name__, exc))
    return {"bytes": size, "saved": saved, "lost": lost, "error": None}


_pickler = None


def _pickler_base():
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


def _session_pickler(definitions):
    """(name, factory) of the pickler of values: factory(file, buffers) pickles to `file`.

    It is cloudpickle's or dill's Pickler when one can be imported, else pickle's, protocol 5,
    putting out-of-band buffers of _OUT_OF_BAND_MIN bytes or more in the list `buffers`. It
    pickles the session's `definitions` by reference, as getattr(__main__, name), so that they
    restore as the objects that their restored source made, and modules as imports.
    """
    import importlib

    name, base = _pickler_base()
    by_id = {id(value): (defined, value) for defined, (_, _, value) in definitions.items()}
    session = _session

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

    def out_of_band(buffers, buffer):
        """Keep a large contiguous buffer out of the stream; others stay in (return True)."""
        try:
            view = buffer.raw()
        except BufferError:  # not contiguous
            return True
        if view.nbytes < _OUT_OF_BAND_MIN:
            return True
        buffers.append(view)
        return False

    def factory(file, buffers):
        return SessionPickler(file, protocol=5, buffer_callback=lambda b: out_of_band(buffers, b))

    return name, factory


def _restore(request):
    """Serve a restore request: load the checkpoint file into the namespace."""
    import pickle

    restore_id, path, clear = request.get("id"), request.get("path"), request.get("clear")
    if not isinstance(path, str):
        raise TypeError("restore request %r needs a path string" % (restore_id,))
    reply = {"type": "restore_done", "id": restore_id, "restored": [], "lost": [], "error": None}
    try:
        file = open(path, "rb")
    except OSError as exc:
        return dict(reply, error="cannot open %s: %s" % (path, exc.strerror))
    with file:
        try:
            if file.read(len(_CHECKPOINT_MAGIC)) != _CHECKPOINT_MAGIC:
                raise ValueError("not a pyvisor worker checkpoint")
            file.seek(-_TRAILER.size, os.SEEK_END)
            (index_at,) = _TRAILER.unpack(file.read(_TRAILER.size))
            file.seek(index_at)
            index = pickle.load(file)
            if index.get("format") != _CHECKPOINT_FORMAT:
                raise ValueError("format %r, not %r" % (index.get("format"), _CHECKPOINT_FORMAT))
            # (name, function that restores it, its arguments), in the order of restoring
            pending = [(name, _restore_import, (module,)) for name, module in index["imports"]]
            pending += [
                (name, _restore_source, (kind, source)) for name, kind, source in index["sources"]
            ]
            pending += [
                (name, _restore_value, (file, *place)) for name, *place in index["values"]
            ]
        except Exception as exc:
            return dict(reply, error="cannot read %s: %s: %s" % (path, type(exc).__name__, exc))
        if clear:
            for name in [name for name in _namespace if _is_user_name(name)]:
                del _namespace[name]
            _definitions.clear()
        restored, lost = reply["restored"], {}
        while pending:  # again and again, while names come back: one may need another
            failed = []
            for name, restore, args in pending:
                try:
                    restore(name, *args)
                except BaseException as exc:  # the session's code may raise anything
                    failed.append((name, restore, args))
                    lost[name] = _lost(name, exc)
                else:
                    restored.append(name)
                    lost.pop(name, None)
            if len(failed) == len(pending):
                break
            pending = failed
        reply["lost"] = list(lost.values())
    return reply


def _restore_import(name, module):
    """Restore a module saved as an import."""
    import importlib

    _namespace[name] = importlib.import_module(module)


def _restore_source(name, kind, source):
    """Restore a definition saved as source: run it in the namespace."""
    global _restore_count
    _restore_count += 1
    filename = "<restored-%d>" % _restore_count
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec", dont_inherit=True), _namespace)
    value = _namespace[name]
    _definitions.pop(name, None)
    _definitions[name] = (kind, source, value)


def _restore_value(name, file, offset, length, buffer_sizes):
    """Restore a pickled value from the checkpoint `file`."""
    import pickle

    file.seek(offset)
    data = file.read(length)
    buffers = []
    for size in buffer_sizes:  # writable, so that numpy arrays made on them are
        buffer = bytearray(size)
        if file.readinto(buffer) != size:
            raise EOFError("the checkpoint file is cut short")
        buffers.append(buffer)
    _namespace[name] = pickle.loads(data, buffers=buffers)


# ---------------------------------------------------------------------------------------------
# Introspection
# ---------------------------------------------------------------------------------------------

_SIZE_ITEMS = 100_000  # items of a container sized one by one; beyond, extrapolated


def _inspect(request):
    """The inspect_done reply; runs on the reader thread, also while code runs, and never fails.

    It works from copies of the namespace and of the definitions, which the GIL makes whole.
    """
    variables, definitions = [], []
    try:
        items = sorted((item for item in list(_namespace.items()) if _is_user_name(item[0])),
                       key=lambda item: item[0])
        for name, value in items:
            variables.append({"name": name, "type": _type_name(value), "size_bytes": _size(value)})
        for name, (kind, source, value) in list(_definitions.items()):
            if _namespace.get(name, _MISSING) is value:
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
    """Approximate size of `value` in bytes (see inspect in the docstring); None when unknown."""
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


# ---------------------------------------------------------------------------------------------
# Preloading and the zygote
# ---------------------------------------------------------------------------------------------

ZYGOTE_FD = 3  # the zygote's control socket
CHILD_FDS = 5  # a forked child's stdin, stdout, stderr, request pipe and reply pipe
_USAGE = "usage: worker.py [--zygote] [--preload MODULE[,MODULE...]]"


def _preload(modules):
    """Import `modules`; describe the first that fails to import, or return None."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            return "preload module %r failed to import: %s: %s" % (name, type(exc).__name__, exc)
    return None


def _zygote_main(modules):
    """Zygote mode: import `modules`, then hand a waiting worker to each fork request."""
    # Every module the zygote and its children use is imported here, once, for all of them.
    import fcntl
    import gc
    import resource
    import select
    import socket

    # No collections from here on: they would leave holes in the pages the children share.
    gc.disable()
    server = _ForkServer(socket.socket(fileno=ZYGOTE_FD))
    os.environ.setdefault("MPLBACKEND", "Agg")
    failure = _preload(modules)
    if failure is not None:
        server.send({"type": "failed", "reason": failure})
        os._exit(1)
    compile("x = 1\nx", "<pyvisor-zygote>", "exec", dont_inherit=True)
    _pickler_base()  # so that no forked worker's first checkpoint imports cloudpickle
    try:
        server.serve()
    except BaseException:
        server.send({"type": "failed", "reason": traceback.format_exc()[-8192:]})
        os._exit(1)
    os._exit(0)


class _ForkServer:
    """The zygote's loop: fork requests from the host, and the exits of its children.

    A child is forked ahead of each request (the spare): it waits on a socketpair of its own,
    so that a request costs a send to it instead of a fork of the whole zygote. When there is
    none (it could not be forked, or it died and has been reaped), the request forks a child.
    """

    def __init__(self, control):
        import select

        self.control = control
        self.spare = None  # (pid, socket) of the child waiting for the next request
        self.wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, _on_sigchld)
        signal.set_wakeup_fd(wake_write)
        self.poller = select.poll()
        self.poller.register(ZYGOTE_FD, select.POLLIN)
        self.poller.register(self.wake_read, select.POLLIN)

    def send(self, message):
        """Send one message to the host; exit when the host is gone."""
        try:
            self.control.send(_encode(message).encode("utf-8", "replace"))
        except OSError:
            os._exit(0)

    def serve(self):
        """Say ready, then serve until the host closes the socket."""
        self.send({"type": "ready", "pid": os.getpid()})
        while True:
            if self.spare is None:
                try:
                    self.spare = self._fork(None)
                except OSError:  # no spare for now: the next request forks its child itself
                    pass
            for fd, _ in self.poller.poll():
                if fd == self.wake_read:
                    _drain(self.wake_read)
                    self._reap()
                elif not self._on_request():
                    return

    def _reap(self):
        """Reap every child that has exited; report those the host knows of."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.spare is not None and self.spare[0] == pid:
                self.spare[1].close()
                self.spare = None
            else:
                self.send({"type": "exited", "pid": pid, "status": status})

    def _on_request(self):
        """Serve one fork request; False when the host has closed the socket."""
        import socket

        data, fds, flags, _ = socket.recv_fds(self.control, 1 << 20, CHILD_FDS)
        if not data and not fds:
            return False
        try:
            request = _decode(data.decode("utf-8"))
            request_id = request["id"]
        except (ValueError, TypeError, KeyError):
            request, request_id = None, None
        pid, problem = None, None
        if not isinstance(request, dict) or request.get("type") != "fork":
            problem = "not a fork request"
        elif flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != CHILD_FDS:
            problem = "a fork request needs %d fds, got %d" % (CHILD_FDS, len(fds))
        elif self.spare is not None:
            pid, spare = self.spare
            self.spare = None
            # The host is told first, so that it contains the child while the child sets up.
            self.send({"type": "forked", "id": request_id, "pid": pid})
            try:
                socket.send_fds(spare, [data], fds)
            except OSError:  # the spare has died: the host sees its exit, reaped later
                pass
            spare.close()
            for fd in fds:
                os.close(fd)
            return True
        if problem is None:
            try:
                pid = self._fork((request, fds))
            except OSError as exc:
                problem = "fork failed: %s" % (exc,)
        for fd in fds:
            os.close(fd)
        if problem is None:
            self.send({"type": "forked", "id": request_id, "pid": pid})
        else:
            self.send({"type": "fork_failed", "id": request_id, "reason": problem})
        return True

    def _fork(self, order):
        """Fork a child for `order` (request, fds); with None, a spare that waits for one.

        Returns the child's pid, or for a spare (pid, socket to send it its order on).
        """
        import gc
        import socket

        if order is None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gc.freeze()
        _flush_output()
        pid = os.fork()
        if pid == 0:
            if order is None:
                ours.close()
            _become_worker(self, order, theirs if order is None else None)
        try:
            os.setpgid(pid, pid)
        except OSError:  # the child got there first, or is already gone
            pass
        if order is not None:
            return pid
        theirs.close()
        return pid, ours


def _close_fds_except(keep):
    """Close every fd of the process but those in `keep`."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:  # the directory listing's own descriptor
                pass


def _on_sigchld(signum, frame):
    """SIGCHLD handler of the zygote: nothing to do, the wakeup fd wakes its poll loop."""


def _drain(fd):
    """Read whatever the non-blocking `fd` holds."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _become_worker(server, order, spare_socket):
    """In a child of the zygote: set up, wait for start, serve as a worker. Never returns.

    A spare first waits on `spare_socket` for its order; end of file there (the zygote is gone)
    makes it exit.
    """
    import fcntl
    import gc
    import resource
    import socket

    try:
        # The zygote's socket must close with the zygote, for the host to see it die.
        os.close(server.control.detach())
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setpgid(0, 0)
        if order is None:
            _close_fds_except((0, 1, 2, spare_socket.fileno()))
            data, fds, _, _ = socket.recv_fds(spare_socket, 1 << 20, CHILD_FDS)
            spare_socket.close()
            if not data:
                os._exit(0)
            order = (_decode(data.decode("utf-8")), fds)
        request, fds = order
        # Out of the way of 0-4 first, so that no dup2() overwrites a descriptor still needed.
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, CHILD_FDS) for fd in fds]
        for target, fd in enumerate(moved):
            os.dup2(fd, target)
        _close_fds_except(range(CHILD_FDS))
        for limit in request["rlimits"]:
            number = getattr(resource, "RLIMIT_" + limit["resource"].upper())
            resource.setrlimit(number, (limit["soft"], limit["hard"]))
        if request["cwd"] is not None:
            os.chdir(request["cwd"])
        for name, value in request["env"]:
            os.environ[name] = value
        gc.enable()
    except BaseException as exc:
        os.write(2, ("pyvisor worker: setting up the forked worker failed: %s: %s\n"
                     % (type(exc).__name__, exc)).encode("utf-8", "replace"))
        os._exit(1)
    start = _read_message()  # end of file: the host gave up on this child, which exits
    if start is None or start.get("type") != "start":
        os._exit(1)
    try:
        main()
    finally:
        _exit_worker(1)


def _run(args):
    """Start as the command line says: a worker, or with --zygote the zygote."""
    zygote, preload = False, []
    while args:
        arg = args.pop(0)
        if arg == "--zygote":
            zygote = True
        elif arg == "--preload" and args:
            preload += [name for name in args.pop(0).split(",") if name]
        else:
            sys.exit("pyvisor worker: unknown argument %r; %s" % (arg, _USAGE))
    del sys.argv[1:]
    if zygote:
        _zygote_main(preload)
    else:
        main(preload)


if __name__ == "__main__":
    _run(sys.argv[1:])
