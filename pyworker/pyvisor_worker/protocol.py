"""How the worker and the host talk: frames on fds 3, 4 and 5, and the thread that serves fd 5.

The host starts the worker as ``python3 -I -u <worker directory>`` in its own process group,
with fd 0 reading /dev/null, fds 1 and 2 pipes whose contents the host attributes to the
running execution, and the protocol on three more pipes: fd 3 (host -> worker: the requests),
fd 4 (worker -> host) and fd 5 (host -> worker: control messages).

The main thread reads the requests from fd 3 itself, one at a time, when it has finished the
one before: a request to run code costs no thread switch in the worker. A control thread reads
fd 5 and serves at once, also while code runs, what must reach the worker then: interrupts,
input() answers, LLM answers, inspections, the kill of a speculation child, shutdown. Which
message goes on which pipe is fixed by its type (below).

Framing, both ways: a 4-byte big-endian unsigned length, then that many bytes of UTF-8 JSON
holding one object. No frame is larger than 32 MiB: the worker sends a smaller stand-in for a
message that would be (see ``_stand_in``), and takes a larger incoming one for a corrupt stream.

Host -> worker, on fd 3 (requests):

    {"type": "execute", "id": "e-1", "code": "...", "repr_limit": 65536,
     "transaction": "commit_always" | "rollback_on_failure"}     commit_always when absent
    {"type": "checkpoint", "id": "c-1", "dir": "/dir", "background": true,
     "incremental": true, "max_bytes": 2147483648}
    {"type": "restore", "id": "r-1", "index": {...},
     "groups": [{"token": "...", "names": ["df"], "path": "/dir/blob"}], "clear": true}
    {"type": "complete", "id": "k-1", "text": "df.gr", "cursor": 5}      cursor in characters
    {"type": "speculate", "id": "s-1", "snippets": ["df.head()"], "repr_limit": 65536,
     "output_limit": 65536, "cpu_ms": 2000}
    {"type": "fork", "id": "f-1", "count": 2}                 (see cloning)
    {"type": "adopt", "id": "a-1", "code": "df.head()",
     "reads": [{"name": "df", "fingerprint": "1f0c..." | null}],
     "files": [{"path": "/d/x.csv", "size": 10, "mtime_ns": 1, "ctime_ns": 1, "inode": 7}],
     "ambient": "883fdfd9"}
    {"type": "counted", "code": "df.head()"}                  no reply
    {"type": "llm_enable"}                                    no reply (see bridge)

Host -> worker, on fd 5 (control):

    {"type": "interrupt", "id": "e-1"}
    {"type": "input_reply", "id": "e-1", "value": "text"}     "value": null makes it EOF
    {"type": "inspect", "id": "i-1"}
    {"type": "cancel_speculation", "id": "s-1"}
    {"type": "llm_reply", "call": 7, "answers": ["..."], "error": null}       (see bridge)
    {"type": "shutdown"}

An execute may also carry "facts": true, for a "facts" message about the cell after its result,
and "cell": N, the session's execution count, so that its code is compiled as ``<cell-N>``
even in a worker that replaced a crashed one (else the worker counts its own executions).

The requests of fd 3 are taken up one at a time by the main thread, in order; taking up an
execute or a restore kills the speculation child first. The control messages of fd 5 are
served at once by the control thread, also while code runs. An interrupt may arrive before
the main thread has read its execute: it is kept and ends that execution when it is taken up.
An input_reply counts only while an input() of that execution waits for one; other replies,
and messages of unknown types (on either pipe), are ignored.

Worker -> host:

    {"type": "hello", "protocol": 1, "pid": 1234, "python_version": "3.11.7",
     "executable": "/usr/bin/python3", "capabilities": ["checkpoint", ...]}
                                                                once, when ready for requests

"capabilities" (``CAPABILITIES``) names the requests this worker serves beyond execute,
interrupt, input_reply and shutdown ("facts" being the flag of an execute): the host sends an
optional request only to a worker that announced it, and drops a message kind it does not know
with a warning, so a newer worker or host works with an older other side. A new request or
message kind comes with a new capability, not a new protocol version.
    {"type": "input_request", "id": "e-1", "prompt": "Name: ", "password": false}
    {"type": "display", "id": "e-1", "mime": "image/png", "data": "<base64>"}
    {"type": "result", "id": "e-1", "status": "ok" | "error",
     "result": {"repr": "4", "type": "int"} | null,
     "error": {"type": "KeyError", "message": "'x'", "traceback": ["..."]} | null,
     "changed": true, "rolled_back": false}
    {"type": "checkpoint_done", "id": "c-1", "bytes": 5120, "saved": ["df", "f", "np"],
     "lost": [{"name": "sock", "reason": "TypeError: cannot pickle 'socket' object"}],
     "error": null | "why no checkpoint was written", "index": {...},
     "groups": [{"token": "...", "names": ["df"], "file": "....blob" | null, "bytes": 5000}]}
    {"type": "restore_done", "id": "r-1", "restored": ["np", "df"], "kept": ["f"],
     "lost": [...], "error": null | "why the request could not be used"}
    {"type": "inspect_done", "id": "i-1",
     "variables": [{"name": "df", "type": "pandas.core.frame.DataFrame", "size_bytes": 2400}],
     "definitions": [{"name": "f", "kind": "function" | "class" | "lambda", "source": "..."}],
     "rss_bytes": 31457280 | null}
    {"type": "complete_done", "id": "k-1", "matches": ["df.groupby("]}
    {"type": "speculated", "id": "s-1", "index": 0,
     "outcome": {"status", "stdout", "stderr", "result", "display": [{"mime", "data"}],
                 "error", "servable", "refusal", "reads", "files", "ambient", "binds",
                 "cpu_ms", "duration_ms"}}
    {"type": "speculation_done", "id": "s-1", "ending": "finished" | "cancelled" |
     "cpu_limit" | "crashed: killed by SIGSEGV" | "crashed: exit status 1", "cpu_ms": 12.5}
    {"type": "adopt_done", "id": "a-1", "fresh": false, "reason": null | "changed df"}
    {"type": "forked", "id": "f-1", "clones": [{"pid": 1300, "stdout": 7, "stderr": 9,
     "requests": 12, "replies": 13}], "threads": 0, "error": null}            (see cloning)
    {"type": "llm_call", "id": "e-1", "call": 7, "kind": "llm", "prompts": ["..."],
     "model": null}                      from any thread of the session's code (see bridge)

After the result of an execute with "facts": true comes
    {"type": "facts", "id": "e-1", "facts": {"reads", "binds", "touched", "files", "ambient",
     "objects", "pure", "cost_ms"} | null}
computed once the result is sent (null when they could not be), before any later reply; not
sent at all when the next execute or a restore came first (the reply to that one then says
they are unknown).

Every execute request gets exactly one result, after its input requests and displays. The
modules that make the messages document their fields: execution (results, errors and
interrupts), changes ("changed" and transactions), display, prompts (input requests),
checkpoints (checkpoints), versions (groups and what changed), blobfiles (the files), restores,
inspection, zygote (preload and the zygote), facts (cell facts, with summaries and
surroundings), completion (complete), speculation and snippets (speculative runs, with purity
for the guard and fingerprints for the stamps), adoption (adopt).

Ordering: before writing any frame, the worker flushes sys.stdout and sys.stderr (and the
original ones, should the code have replaced them), so all that the code printed before a frame
is in the fd 1/2 pipes when the frame arrives. The worker itself never writes to fds 1 and 2.

Exit status: 0 after a shutdown request or when the host closes its end of fd 3, 4 or 5; 1 when
the protocol stream is corrupt or its fds are unusable, or a preload module fails to import.
"""

import _thread
import json
import os
import queue
import select
import signal
import struct
import sys
import threading

from pyvisor_worker import state

PROTOCOL_VERSION = 2
# The optional requests served here, announced in the hello (see the module doc).
CAPABILITIES = ("checkpoint", "restore", "inspect", "complete", "speculate", "adopt", "facts",
                "fork")
REQUEST_FD = 3
REPLY_FD = 4
CONTROL_FD = 5
MAX_FRAME = 32 * 1024 * 1024

_HEADER = struct.Struct(">I")
encode = json.JSONEncoder(ensure_ascii=False, check_circular=False, separators=(",", ":")).encode
decode = json.JSONDecoder().decode
_write_lock = threading.Lock()

# The control thread's answers (None meaning end of file) for the input() waiting for one.
input_replies = queue.SimpleQueue()
_requests_poll = select.poll()
_requests_poll.register(REQUEST_FD, select.POLLIN)


def reset_in_clone():
    """In a clone of the session (see cloning): the answers queued for the source, and a
    write lock a thread of it may have held at the fork, are not the clone's."""
    global input_replies, _write_lock
    input_replies = queue.SimpleQueue()
    _write_lock = threading.Lock()


def close_protocol_fds():
    """In a child that must never speak the protocol (a checkpoint or speculation child)."""
    for fd in (REQUEST_FD, REPLY_FD, CONTROL_FD):
        os.close(fd)


def flush_output():
    """Flush the code's output streams, ignoring any that the code replaced or broke."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def exit_worker(status):
    """End the worker process now, with the code's output flushed."""
    flush_output()
    os._exit(status)


def send(message):
    """Write `message` to the host as one frame, after flushing the code's output."""
    payload = encode(message).encode("utf-8", "replace")
    while len(payload) > MAX_FRAME:
        message = _stand_in(message, len(payload))
        payload = encode(message).encode("utf-8", "replace")
    frame = _HEADER.pack(len(payload)) + payload
    flush_output()
    if state.sigint_action == "raise" and threading.get_ident() == state.MAIN_THREAD:
        # The session's code is writing (display(), input()): a KeyboardInterrupt must not cut
        # the frame short, so it is raised once the frame is whole.
        state.sigint_action = "defer"
        try:
            _write_frame(frame)
        finally:
            state.sigint_action = "raise"
        if state.sigint_deferred:
            state.sigint_deferred = False
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
            exit_worker(0)
        except OSError:
            exit_worker(1)


def _stand_in(message, size):
    """A smaller message to send instead of `message`, whose frame would take `size` bytes."""
    kind = message["type"]
    note = "[pyvisor] %s of %d bytes exceeds the %d-byte frame limit" % (kind, size, MAX_FRAME)
    if kind == "display":
        return dict(message, mime="text/plain", data=note)
    if kind == "input_request":
        return dict(message, prompt=note)
    if kind == "checkpoint_done":  # half of its groups would be a checkpoint missing names
        return {"type": kind, "id": message.get("id"), "bytes": 0, "saved": [], "lost": [],
                "error": note}
    if kind == "speculated":  # an answer too large to cache
        outcome = dict(message["outcome"], stdout="", stderr="", result=None, display=[],
                       servable=False, refusal=note)
        return dict(message, outcome=outcome)
    if kind != "result":  # restore_done, inspect_done: keep half of each list
        return {key: value[: len(value) // 2] if isinstance(value, list) else value
                for key, value in message.items()}
    result = message["result"]
    if result is not None and "html" in result:
        return dict(message, result={"repr": result["repr"], "type": result["type"]})
    error = {"type": "WorkerError", "message": note, "traceback": []}
    return dict(message, status="error", result=None, error=error)


def _read_exact(fd, size):
    """The next `size` bytes of `fd`; exits the worker when the host has closed it."""
    try:
        data = os.read(fd, size)
        if len(data) < size:  # a large frame comes through the pipe in pieces
            buffer = bytearray(data)
            while data and len(buffer) < size:
                data = os.read(fd, size - len(buffer))
                buffer += data
            data = buffer
    except OSError:
        exit_worker(1)
    if len(data) < size:
        exit_worker(0)
    return data


def read_message(fd=REQUEST_FD):
    """The next message from the host on `fd`; None for a frame that holds no JSON object."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if size > MAX_FRAME:
        exit_worker(1)
    try:
        message = decode(_read_exact(fd, size).decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) else None


def next_request(timeout=None):
    """Main thread: the next request from fd 3, waiting for it at most `timeout` seconds
    (for ever when None); None when none came in time."""
    while True:
        if timeout is not None and not request_waiting(timeout):
            return None
        message = read_message(REQUEST_FD)
        if message is not None:
            return message


def request_waiting(timeout=0.0):
    """Whether a request waits on fd 3, or arrives within `timeout` seconds."""
    return bool(_requests_poll.poll(timeout * 1000))


def start_thread(function, *args):
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


def read_control(interrupt, inspect, cancel_speculation, bridge):
    """Control thread: serve every message of fd 5 at once, also while the code runs.

    `interrupt(execution_id)` serves an interrupt, `inspect(request)` makes the reply to an
    inspect request, and `cancel_speculation(speculation_id)` kills the speculation child;
    `bridge` is the bridge module, for llm_reply.
    """
    while True:
        message = read_message(CONTROL_FD)
        if message is None:
            continue
        kind = message.get("type")
        if kind == "interrupt":
            interrupt(message.get("id"))
        elif kind == "input_reply":
            waiting_for = state.input_waiting_for
            if waiting_for is not None and message.get("id") == waiting_for:
                value = message.get("value")
                input_replies.put(value if isinstance(value, str) else None)
        elif kind == "inspect":
            send(inspect(message))
        elif kind == "cancel_speculation":
            cancel_speculation(message.get("id"))
        elif kind == "llm_reply":
            bridge.on_reply(message)
        elif kind == "shutdown":
            exit_worker(0)
