"""pyvisor worker: runs the Python code of one pyvisor session.

The host starts it as ``python3 -I -u worker.py`` in its own process group, with fd 0 reading
/dev/null, fds 1 and 2 pipes whose contents the host attributes to the running execution, and
the protocol on two more pipes: fd 3 (host -> worker) and fd 4 (worker -> host). Standard
library only; Python 3.9 or newer.

Framing, both ways: a 4-byte big-endian unsigned length, then that many bytes of UTF-8 JSON
holding one object. No frame is larger than 32 MiB: the worker replaces anything that would be
(see ``_stand_in``), and treats a larger incoming frame as a corrupt stream.

Host -> worker:

    {"type": "execute", "id": "e-1", "code": "...", "repr_limit": 65536}
    {"type": "input_reply", "id": "e-1", "value": "text"}    value null: input() raises EOFError
    {"type": "shutdown"}

Executions run one at a time in arrival order. An input_reply counts only while an input() of
that execution waits for it; other replies, and messages of unknown types, are ignored.

Worker -> host:

    {"type": "hello", "protocol": 1, "pid": 1234, "python_version": "3.11.7",
     "executable": "/usr/bin/python3"}                        once, when ready for requests
    {"type": "input_request", "id": "e-1", "prompt": "Name: ", "password": false}
    {"type": "display", "id": "e-1", "mime": "image/png", "data": "<base64>"}
    {"type": "result", "id": "e-1", "status": "ok" | "error",
     "result": {"repr": "4", "type": "int"} | null,
     "error": {"type": "KeyError", "message": "'x'", "traceback": ["Traceback ...\\n", ...]} | null}

Every execute request gets exactly one result, after its input requests and displays. "result"
is set when the code ends with an expression statement whose value is not None: its repr() cut
to repr_limit UTF-8 bytes (ending in "…" when cut), its type's name and, when the value has
``_repr_html_``, its HTML as "html". "error" carries the exception's class name, str() and
traceback, with the worker's own frames removed; SystemExit and KeyboardInterrupt are errors
like any other, and the worker goes on serving. "WorkerError" marks a fault of the worker
itself. A display's data is base64 for image/png and text for the other types (image/svg+xml,
text/html, text/plain); pyplot figures still open when an execution ends are sent as PNG
displays and closed.

Ordering: before writing any frame the worker flushes sys.stdout and sys.stderr (and the
original ones, if the code replaced them), so everything the code printed before a frame is in
the fd 1/2 pipes when the frame arrives. The worker itself never writes to fds 1 and 2.

Interrupts: the host sends SIGINT to the worker's pid. It raises KeyboardInterrupt in the
session's code (also inside time.sleep(), input() and the repr() of the result); when no code
runs, or while a frame is being written, it is ignored or held back until the frame is whole.

Exit status: 0 after a shutdown request or when the host closes fd 3 or fd 4; 1 when the
protocol stream is corrupt or its fds are unusable.
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
    """Flush the user-visible output streams, ignoring any that the code replaced or broke."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def _exit_worker(status):
    """End the worker process at once, flushing the code's output first."""
    _flush_output()
    os._exit(status)


def send(message):
    """Write `message` to the host as one frame, after flushing the code's output."""
    global _sigint_action, _sigint_deferred
    payload = _encode(message).encode("utf-8", "replace")
    while len(payload) > MAX_FRAME:
        message = _stand_in(message, len(payload))
        payload = _encode(message).encode("utf-8", "replace")
    frame = _HEADER.pack(len(payload)) + payload
    _flush_output()
    if _sigint_action == "raise" and threading.get_ident() == _MAIN_THREAD:
        # The session's code (display(), input()) is writing: a KeyboardInterrupt must not
        # cut the frame short, so it is raised once the frame is whole.
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
    """Write all of `frame` to fd 4; exit if the host is gone."""
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
    """A smaller message to send instead of `message`, whose frame would be `size` bytes."""
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
        while len(data) < size:
            chunk = os.read(REQUEST_FD, size - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        _exit_worker(1)
    if len(data) < size:
        _exit_worker(0)
    return data


def _read_message():
    """The next message from the host; None for a frame that is not a JSON object."""
    (size,) = _HEADER.unpack(_read_exact(_HEADER.size))
    if size > MAX_FRAME:
        _exit_worker(1)
    try:
        message = _decode(_read_exact(size).decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


# Requests routed by the reader thread: execute requests for the main loop, input replies for
# the input() that waits for one (None meaning end of file).
_executions = queue.SimpleQueue()
_input_replies = queue.SimpleQueue()


def _read_requests():
    """Reader thread: route every message from the host while the main thread runs code."""
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
_current_id = None  # id of the running execution, read by other threads
_input_waiting_for = None  # id of the execution whose input() awaits a reply
_input_lock = threading.Lock()
_forked = False


def _execute(request):
    """Run one execute request in the session namespace; return its result message."""
    global _cell_count, _current_id
    execution_id = request.get("id")
    code = request.get("code")
    if not isinstance(code, str):
        raise TypeError("execute request %r has no code string" % (execution_id,))
    repr_limit = request.get("repr_limit", DEFAULT_REPR_LIMIT)
    _cell_count += 1
    filename = "<cell-%d>" % _cell_count
    # Tracebacks, inspect and pdb read a cell's source from linecache, like a file's.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    _current_id = execution_id
    try:
        value, error = _run_user_code(_run_cell, code, filename, repr_limit)
    finally:
        _current_id = None
        if _input_waiting_for is not None:
            _input_replies.put(None)  # an input() on another thread outlived its execution
    if _forked:
        # A process forked by the code has come back here: it ends like a script would.
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


def _run_user_code(function, *args):
    """Call function(*args) with SIGINT armed; return (value, None) or (None, exception)."""
    global _sigint_action
    _sigint_action = "raise"
    try:
        return function(*args), None
    except BaseException as exc:
        return None, exc
    finally:
        _sigint_action = "ignore"


def _run_cell(code, filename, repr_limit):
    """Run `code` as one cell; describe the value of a final expression statement, if any."""
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


def _clip(text, limit):
    """`text` cut to at most `limit` UTF-8 bytes, ending in "…" when cut."""
    if len(text) * 4 <= limit:  # no character takes more than 4 bytes
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[: max(limit - 3, 0)].decode("utf-8", "ignore") + "…"


def _describe_error(exc, limit):
    """The "error" object of a result for an exception raised by the session's code."""
    if isinstance(exc, SyntaxError) and exc.text is None and exc.filename and exc.lineno:
        # Errors found after parsing (e.g. 'return' outside function) carry no source line.
        exc.text = linecache.getline(exc.filename, exc.lineno) or None
    try:
        message = str(exc)
    except Exception:
        message = "<exception str() failed>"
    lines = [_clip(line, limit) for line in _user_traceback(exc)]
    return {"type": type(exc).__name__, "message": _clip(message, limit), "traceback": lines}


def _user_traceback(exc):
    """traceback.format_exception() of `exc` without the worker's own frames."""
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
    """The "error" object of a result that failed because of a fault in the worker itself."""
    return {
        "type": "WorkerError",
        "message": "internal error in the pyvisor worker: %s: %s" % (type(exc).__name__, exc),
        "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__),
    }


def _reopen_stdin():
    """exit() closes sys.stdin on its way out; give later cells a fresh reader of fd 0."""
    if sys.stdin is sys.__stdin__ and getattr(sys.stdin, "closed", False):
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)


# --- display() and pyplot figures -------------------------------------------------------------

_RICH_MIMES = (("image/png", "_repr_png_"), ("image/svg+xml", "_repr_svg_"), ("text/html", "_repr_html_"))


def display(*objs):
    """Show each object in the client, in the richest format it offers (IPython's protocol)."""
    execution_id = _current_id
    if execution_id is None:  # no execution to show it in (e.g. a thread outliving its cell)
        return
    for obj in objs:
        mime, data = _display_data(obj)
        send({"type": "display", "id": execution_id, "mime": mime, "data": data})


def _display_data(obj):
    """(mime, data) of the richest representation `obj` offers; repr() as the last resort."""
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
    """What obj.<name>() returns, or None when the method is missing or fails."""
    if isinstance(obj, type):  # a class's _repr_*_ methods describe its instances
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
    """A matplotlib figure rendered as an image/png display."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    return "image/png", base64.b64encode(buffer.getvalue()).decode("ascii")


def _show_open_figures(execution_id):
    """Send the pyplot figures the execution left open as PNG displays, then close them."""
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
            send({"type": "display", "id": execution_id, "mime": mime, "data": data})


def _send_note(execution_id, what, exc):
    """Tell the client, as a text/plain display, that the worker failed to do `what`."""
    data = "[pyvisor] %s: %s: %s" % (what, type(exc).__name__, exc)
    send({"type": "display", "id": execution_id, "mime": "text/plain", "data": data})


# --- input() and getpass() --------------------------------------------------------------------


def _input(prompt=""):
    """input() for the session's code: the client shows the prompt and answers the line."""
    return _ask(str(prompt), False)


def _getpass(prompt="Password: ", stream=None):
    """getpass.getpass() for the session's code: the client asks without echoing."""
    return _ask(str(prompt), True)


def _ask(prompt, password):
    """Send an input request for the running execution and wait for the client's answer."""
    global _input_waiting_for
    with _input_lock:
        while not _input_replies.empty():  # answers to earlier, interrupted requests
            _input_replies.get_nowait()
        execution_id = _input_waiting_for = _current_id
        try:
            # Checked after announcing the wait: an execution that ends from now on wakes us.
            if execution_id is None or _current_id != execution_id:
                raise EOFError("EOF when reading a line")
            request = {"type": "input_request", "id": execution_id, "prompt": prompt}
            request["password"] = password
            send(request)
            value = _input_replies.get()
        finally:
            _input_waiting_for = None
    if value is None:
        raise EOFError("EOF when reading a line")
    return value


def _after_fork_in_child():
    """A process forked by the session's code must stay off the protocol pipes."""
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
        send(reply)


def main():
    for fd in (REQUEST_FD, REPLY_FD):
        try:
            os.set_inheritable(fd, False)  # keep them from os.system() and subprocess children
        except OSError:
            sys.exit("pyvisor worker: fd %d is not open; pyvisor passes its pipes as fds 3 and 4" % fd)
    os.environ.setdefault("MPLBACKEND", "Agg")
    signal.signal(signal.SIGINT, _on_sigint)
    sys.modules["__main__"] = _session
    builtins.input = _input
    builtins.display = display
    getpass.getpass = _getpass
    os.register_at_fork(after_in_child=_after_fork_in_child)
    # The reader thread inherits a mask blocking every signal, so that the kernel delivers the
    # host's SIGINT (and any signal the code waits for) to the main thread, waking it from
    # blocking calls.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    threading.Thread(target=_read_requests, name="pyvisor-reader", daemon=True).start()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    send({
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "pid": os.getpid(),
        "python_version": sys.version.split()[0],
        "executable": sys.executable,
    })
    _serve()


if __name__ == "__main__":
    main()
