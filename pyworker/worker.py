"""pyvisor worker: runs the Python code of one pyvisor session.

The host starts it as ``python3 -I -u worker.py`` in its own process group, with fd 0 reading
/dev/null, fds 1 and 2 pipes whose contents the host attributes to the running execution, and
the protocol on two more pipes: fd 3 (host -> worker) and fd 4 (worker -> host). Standard
library only; Python 3.9 or newer.

Framing, both ways: a 4-byte big-endian unsigned length, then that many bytes of UTF-8 JSON
holding one object. No frame is larger than 32 MiB: the worker sends a smaller stand-in for a
message that would be (see ``_stand_in``), and takes a larger incoming one for a corrupt stream.

Host -> worker:

    {"type": "execute", "id": "e-1", "code": "...", "repr_limit": 65536}
    {"type": "input_reply", "id": "e-1", "value": "text"}     "value": null makes it EOF
    {"type": "shutdown"}

Executions run one at a time, in arrival order. An input_reply counts only while an input() of
that execution waits for one; other replies, and messages of unknown types, are ignored.

Worker -> host:

    {"type": "hello", "protocol": 1, "pid": 1234, "python_version": "3.11.7",
     "executable": "/usr/bin/python3"}                          once, when ready for requests
    {"type": "input_request", "id": "e-1", "prompt": "Name: ", "password": false}
    {"type": "display", "id": "e-1", "mime": "image/png", "data": "<base64>"}
    {"type": "result", "id": "e-1", "status": "ok" | "error",
     "result": {"repr": "4", "type": "int"} | null,
     "error": {"type": "KeyError", "message": "'x'", "traceback": ["..."]} | null}

Every execute request gets exactly one result, after its input requests and displays.
"result" is set when the code ends with an expression statement whose value is not None, as at
the interactive prompt: its repr() cut to repr_limit UTF-8 bytes (ending in "…" when cut), the
name of its type and, when the value has ``_repr_html_``, its HTML as "html". "error" holds the
exception's class name, str() and traceback.format_exception() lines without the worker's own
frames; SystemExit and KeyboardInterrupt are errors like the others, and the worker goes on
serving. The error type "WorkerError" marks a fault of the worker itself. A display's data is
base64 for image/png and text for image/svg+xml, text/html and text/plain.

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

Interrupts: the host sends SIGINT to the worker's pid. It raises KeyboardInterrupt in the
session's code, also inside blocking calls such as time.sleep() and input(), and in the repr()
of the result. While no code runs it is ignored; while the code has a frame written (display(),
input()) it is held back until the frame is whole.

Exit status: 0 after a shutdown request or when the host closes its end of fd 3 or fd 4; 1 when
the protocol stream is corrupt or its fds are unusable.
"""

import ast
import base64
import builtins
import getpass
import io
import json
import linecache
import os
import queue
import re
import signal
import struct
import sys
import threading
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


def _on_sigint(signum, frame):
    """SIGINT handler: interrupt the session's code, never the worker's own work."""
    global _sigint_deferred
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


# The reader thread's outputs: execute requests for the main loop, and answers (None meaning
# end of file) for the input() waiting for one.
_executions = queue.SimpleQueue()
_input_replies = queue.SimpleQueue()


def _read_requests():
    """Reader thread: route every message from the host, also while the code runs."""
    while True:
        message = _read_message()
        if message is None:
            continue
        kind = message.get("type")
        if kind == "execute":
            _executions.put(message)
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
_current_id = None  # id of the running execution; other threads read it
_input_waiting_for = None  # id of the execution whose input() waits for an answer
_input_lock = threading.Lock()
_forked = False  # this process is a child that the session's code forked


def _execute(request):
    """Run one execute request in the session namespace; return its result message."""
    global _cell_count, _current_id, _sigint_action
    execution_id = request.get("id")
    code = request.get("code")
    repr_limit = request.get("repr_limit", DEFAULT_REPR_LIMIT)
    if not isinstance(code, str) or not isinstance(repr_limit, int):
        problem = "execute request %r needs a code string and an int repr_limit"
        raise TypeError(problem % (execution_id,))
    _cell_count += 1
    filename = "<cell-%d>" % _cell_count
    # Tracebacks, inspect and pdb read a cell's source from linecache, as they do a file's.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    _current_id = execution_id
    _sigint_action = "raise"
    try:
        value, error = _run_cell(code, filename, repr_limit), None
    except BaseException as exc:
        value, error = None, exc
    finally:
        _sigint_action = "ignore"
        _current_id = None
        if _input_waiting_for is not None:
            _input_replies.put(None)  # an input() on another thread outlived its execution
    if _forked:
        # A process that the code forked has come back here: it ends as a script would.
        _exit_worker(0 if error is None else 1)
    _show_open_figures(execution_id)
    if error is None:
        return _result(execution_id, value, None)
    if isinstance(error, SystemExit):
        _reopen_stdin()
    return _result(execution_id, None, _describe_error(error, repr_limit))


def _result(execution_id, value, error):
    """The result message of an execution."""
    status = "ok" if error is None else "error"
    return {"type": "result", "id": execution_id, "status": status, "result": value, "error": error}


def _run_cell(code, filename, repr_limit):
    """Run `code` as one cell; describe the value of a final expression statement, if any."""
    if not _may_end_with_expression(code):
        exec(compile(code, filename, "exec", dont_inherit=True), _namespace)
        return None
    module = compile(code, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    body = module.body
    if not body or type(body[-1]) is not ast.Expr:
        exec(compile(module, filename, "exec", dont_inherit=True), _namespace)
        return None
    last = body.pop()
    if body:
        exec(compile(module, filename, "exec", dont_inherit=True), _namespace)
    expression = compile(ast.Expression(last.value), filename, "eval", dont_inherit=True)
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
    global _forked, _current_id
    _forked = True
    _current_id = None


# --- main loop --------------------------------------------------------------------------------


def _serve():
    """Main loop: run the execute requests one at a time, in arrival order."""
    while True:
        request = _executions.get()
        try:
            reply = _execute(request)
        except BaseException as exc:
            reply = _result(request.get("id"), None, _worker_error(exc))
        _send(reply)


def main():
    """Set the process up as a session's worker, say hello, and serve until told to stop."""
    for fd in (REQUEST_FD, REPLY_FD):
        try:
            os.set_inheritable(fd, False)  # keep them from os.system() and subprocesses
        except OSError:
            sys.exit("pyvisor worker: fd %d is not open (pyvisor passes pipes as fds 3 and 4)" % fd)
    os.environ.setdefault("MPLBACKEND", "Agg")
    signal.signal(signal.SIGINT, _on_sigint)
    sys.modules["__main__"] = _session
    builtins.input = _input
    builtins.display = display
    getpass.getpass = _getpass
    os.register_at_fork(after_in_child=_after_fork_in_child)
    # The reader thread starts with every signal blocked, so that the kernel delivers the host's
    # SIGINT (and any signal the code waits for) to the main thread, waking it from blocking
    # calls.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    threading.Thread(target=_read_requests, name="pyvisor-reader", daemon=True).start()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    _send({
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "pid": os.getpid(),
        "python_version": sys.version.split()[0],
        "executable": sys.executable,
    })
    _serve()


if __name__ == "__main__":
    main()
