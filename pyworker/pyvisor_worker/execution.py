"""Running the session's code: executions, their results and errors, and interrupts.

What the code sees: one namespace for the whole session, the dict of a fresh ``__main__``
module (so pickle finds what the code defines); each execution compiled as ``<cell-N>``, its
source in linecache for tracebacks. A process that the code forks without exec never writes
to fd 4, and exits if it returns into the worker.

"result" is set when the code ends with an expression statement whose value is not None, as at
the interactive prompt: its repr() cut to repr_limit UTF-8 bytes (ending in "…" when cut), the
name of its type and, when the value has ``_repr_html_``, its HTML as "html". "error" holds the
exception's class name, str() and traceback.format_exception() lines without the worker's own
frames; SystemExit and KeyboardInterrupt are errors like the others, and the worker goes on
serving. The error type "WorkerError" marks a fault of the worker itself.

Warnings: each execution starts with every warning registry emptied, so a warning is printed
once per place in each execution that raises it, whatever ran before (Python's default would
print it once per line number and module for the life of the process, and any
``warnings.catch_warnings()`` inside a library would silently bring it back). The same holds
for a speculative run in a forked child, so its answer is the one a real run would give.

Interrupts: the host sends an interrupt naming the execution, not a signal, so that an
interrupt sent as soon as the execute request is written is not lost while the execution waits
for the main thread, and a late one never reaches the next execution. When that execution runs
and has not been interrupted yet, the control thread sends SIGINT to the main thread: it raises
KeyboardInterrupt in the session's code, also inside blocking calls such as time.sleep() and
input(), and in the repr() of the result; while the code has a frame written (display(),
input()) it is held back until the frame is whole. An interrupt that names no running execution
is kept (the last one only): when the main thread then takes up that execution, it ends with a
KeyboardInterrupt error without running any code. The host interrupts only the execution it
sent last, so an interrupt of an execution that has finished never matches a later one. A SIGINT from elsewhere (the code's own os.kill()) raises
KeyboardInterrupt in the running code too, and is ignored while no code runs.
"""

import ast
import linecache
import os
import signal
import sys
import threading
import time
import traceback
import warnings

from pyvisor_worker import cells, changes, display, facts, protocol, quiet, state

DEFAULT_REPR_LIMIT = 64 * 1024

# How long the worker waits for a next request before it computes an execution's facts: longer
# than a client's turn-around between back-to-back cells, short beside any pause worth
# speculating in.
FACTS_GRACE = 0.002

# Frames of files under this directory are the worker's own, left out of the code's tracebacks.
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep

_cell_count = 0
pending_facts = None  # (execution id, facts.Recorder, changes.Watch) of the last execution
_current_interrupted = False  # the running execution has had its SIGINT
_sigint_seen = False  # the SIGINT handler has run since the running execution was interrupted
_forked = False  # this process is a child that the session's code forked


def on_sigint(signum, frame):
    """SIGINT handler: interrupt the session's code, never the worker's own work."""
    global _sigint_seen
    _sigint_seen = True
    if state.sigint_action == "raise":
        raise KeyboardInterrupt
    if state.sigint_action == "defer":
        state.sigint_deferred = True


def interrupt(execution_id):
    """Control thread: interrupt the execution `execution_id` if it runs, else keep the
    interrupt for when the main thread takes it up."""
    global _current_interrupted, _sigint_seen
    if type(execution_id) is not str:
        return
    with state.execution_lock:
        if execution_id == state.current_id:
            if not _current_interrupted:
                _current_interrupted = True
                _sigint_seen = False
                # To the main thread itself, which the code may block in a system call.
                signal.pthread_kill(state.MAIN_THREAD, signal.SIGINT)
                protocol.start_thread(_repeat_interrupt, execution_id)
        else:
            state.interrupted_early = execution_id


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
        with state.execution_lock:
            if execution_id != state.current_id or _sigint_seen:
                return
            signal.pthread_kill(state.MAIN_THREAD, signal.SIGINT)


def execute(request):
    """Run one execute request in the session namespace; return its result message."""
    global _current_interrupted, pending_facts
    execution_id = request.get("id")
    code = request.get("code")
    repr_limit = request.get("repr_limit", DEFAULT_REPR_LIMIT)
    transaction = request.get("transaction", "commit_always")
    number = request.get("cell")
    if (not isinstance(code, str) or not isinstance(repr_limit, int)
            or transaction not in ("commit_always", "rollback_on_failure")
            or (number is not None and (type(number) is not int or number < 1))):
        problem = ("execute request %r needs a code string, an int repr_limit, a transaction"
                   " and no cell or a positive int one")
        raise TypeError(problem % (execution_id,))
    if state.fork_note is not None:  # the first execution of a clone: see cloning
        note, state.fork_note = state.fork_note, None
        os.write(2, note.encode("utf-8"))
    cell = cells.Cell(code, count_cell(code, number))
    watch = changes.Watch(cell, rollback=transaction == "rollback_on_failure")
    recorder = facts.Recorder(cell) if request.get("facts") is True else None
    try:
        with state.execution_lock:  # taken up: from here on, an interrupt of it is a SIGINT
            interrupted = type(execution_id) is str and state.interrupted_early == execution_id
            if interrupted:
                state.interrupted_early = None
            else:
                state.current_id = execution_id
                _current_interrupted = False
                state.sigint_action = "raise"
        if interrupted:  # before it started: it ends without running any code
            raise KeyboardInterrupt
        watch.before_run()  # part of the execution: a SIGINT stops a long snapshot too
        with facts.NOT_RECORDING if recorder is None else recorder.files:
            value, error = run_cell(cell, repr_limit), None
    except BaseException as exc:
        value, error = None, exc
    finally:
        state.sigint_action = "ignore"  # first: a SIGINT on its way from here on is ignored
        with state.execution_lock:
            state.current_id = None
        if state.input_waiting_for is not None:
            protocol.input_replies.put(None)  # an input() on another thread outlived its execution
    if _forked:
        # A process that the code forked has come back here: it ends as a script would.
        protocol.exit_worker(0 if error is None else 1)
    changed, rolled_back = watch.after_run(error)
    display.show_open_figures(execution_id)
    if error is not None:
        if isinstance(error, SystemExit):
            _reopen_stdin()
        error = describe_error(error, repr_limit)
    if recorder is not None:
        pending_facts = (execution_id, recorder, watch)
    return result(execution_id, value, error, changed, rolled_back)


def send_facts():
    """After the result of an execution that asked for facts: send its "facts" message.

    Returns the request that came in the meantime, for the main loop to serve next, or None.

    The facts are computed after the result is sent, so that the caller never waits for them,
    and only once the session looks idle: the worker first waits up to FACTS_GRACE for the
    next request. When an execute or a restore comes in that time (a caller running cells
    back to back), they are neither computed nor sent: the reply to that request tells the
    host they are unknown, it forgets what it knew of the namespace, which costs it nothing
    it could use in a loop, and the loop pays neither for facts it cannot use nor for a frame
    that says so. Another request (a checkpoint, say) is served after the facts.
    """
    global pending_facts
    if pending_facts is None:
        return None
    execution_id, recorder, watch = pending_facts
    pending_facts = None
    arrived = protocol.next_request(timeout=FACTS_GRACE)
    if arrived is not None and arrived.get("type") in ("execute", "restore"):
        return arrived
    try:
        with quiet.quiet():
            cell_facts = recorder.facts(watch)
    except Exception:  # the host treats unknown facts as "anything may have changed"
        cell_facts = None
    protocol.send({"type": "facts", "id": execution_id, "facts": cell_facts})
    return arrived


def result(execution_id, value, error, changed, rolled_back=False):
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


def count_cell(code, number=None):
    """Count an execution of `code`: its filename, ``<cell-N>``, with its source in linecache.

    `number` is the host's count of the session's executions, which a restored worker takes
    up; without it the worker counts on from its own.
    """
    global _cell_count
    _cell_count = _cell_count + 1 if number is None else number
    filename = "<cell-%d>" % _cell_count
    # Tracebacks, inspect and pdb read a cell's source from linecache, as they do a file's.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    return filename


def next_number():
    """The number N of the next execution's filename, ``<cell-N>``."""
    return _cell_count + 1


def run_cell(cell, repr_limit):
    """Run `cell`; describe the value of a final expression statement, if any."""
    code, filename, namespace = cell.code, cell.filename, state.namespace
    forget_shown_warnings()
    if not cell.parsed:  # Watch.before_run() parses every cell that may end with an expression
        exec(compile(code, filename, "exec", dont_inherit=True), namespace)
        return None
    body = cell.tree.body
    if not body or type(body[-1]) is not ast.Expr:
        exec(compile(cell.tree, filename, "exec", dont_inherit=True), namespace)
        return None
    if len(body) > 1:
        head = ast.Module(body[:-1], type_ignores=[])
        exec(compile(head, filename, "exec", dont_inherit=True), namespace)
    expression = compile(ast.Expression(body[-1].value), filename, "eval", dont_inherit=True)
    value = eval(expression, namespace)
    if value is None:
        return None
    described = {"repr": clip(repr(value), repr_limit), "type": type(value).__name__}
    html = display.call_repr_method(value, "_repr_html_")
    if isinstance(html, str):
        described["html"] = html
    return described


def forget_shown_warnings():
    """Empty every ``__warningregistry__``: any change of the filters does, so add one and put
    the list back as it was."""
    saved = warnings.filters[:]
    warnings.simplefilter("default", append=True)
    warnings.filters[:] = saved


def clip(text, limit):
    """`text` cut to at most `limit` UTF-8 bytes, ending in "…" when cut."""
    if len(text) * 4 <= limit:  # no character takes more than 4 bytes
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[: max(limit - 3, 0)].decode("utf-8", "ignore") + "…"


def describe_error(exc, limit):
    """The "error" object of a result, for an exception raised by the session's code."""
    if isinstance(exc, SyntaxError) and exc.text is None and exc.filename and exc.lineno:
        # Errors found after parsing ('return' outside function, ...) come without the line.
        exc.text = linecache.getline(exc.filename, exc.lineno) or None
    try:
        message = str(exc)
    except Exception:
        message = "<exception str() failed>"
    lines = [clip(line, limit) for line in _user_traceback(exc)]
    return {"type": type(exc).__name__, "message": clip(message, limit), "traceback": lines}


def _user_traceback(exc):
    """traceback.format_exception() of `exc`, without the worker's own frames."""
    top = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    pending = [top]
    while pending:
        summary = pending.pop()
        frames = [frame for frame in summary.stack if not frame.filename.startswith(_PACKAGE_DIR)]
        summary.stack = traceback.StackSummary.from_list(frames)
        pending.extend(chained for chained in (summary.__cause__, summary.__context__) if chained)
        pending.extend(getattr(summary, "exceptions", None) or ())  # exception groups, 3.11+
    return list(top.format())


def worker_error(exc):
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


def fork():
    """os.fork() from the worker itself; 3.12+ would warn of a fork in a process with
    threads on the code's stderr."""
    if sys.version_info < (3, 12):
        return os.fork()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def after_fork_in_child():
    """Keep a process that the session's code forked off the protocol pipes."""
    global _forked
    _forked = True
    state.current_id = None
    state.execution_lock = threading.Lock()  # the control thread, not forked, may have held it


def after_fork_in_clone():
    """A clone of the session (see cloning) serves the protocol again, on pipes of its own;
    what the source had received and not run is not the clone's."""
    global _forked, pending_facts
    _forked = False
    pending_facts = None
    state.interrupted_early = None
    state.input_waiting_for = None
