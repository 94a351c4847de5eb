"""Speculation: predicted snippets run in a forked child, so the session's namespace is never
touched, their outcomes sent as a real execution would have produced them.

A speculate request ({"id", "snippets", "repr_limit", "output_limit", "cpu_ms"}) is taken up by
the main thread between executions: it kills the child of any earlier speculation and forks.
The worker goes on serving at once; a thread reads the child's outcomes from a private pipe
and sends each as {"type": "speculated", "id", "index", "outcome"}, then, once the child is
reaped, {"type": "speculation_done", "id", "ending", "cpu_ms"}: "ending" is "finished",
"cancelled" (killed by the worker), "cpu_limit" (it used its cpu_ms: SIGPROF from a profiling
timer, or SIGXCPU from RLIMIT_CPU, rounded up to whole seconds, as a backstop),
"crashed: killed by SIGSEGV" (any other signal, the OOM killer's SIGKILL among them) or
"crashed: exit status N"; "cpu_ms" is the child's user plus system CPU time, and the
worker's in taking back its pages from the fork (see pages), done once the child is gone and
the main thread serves no execute or restore, before this message is sent. One child at a time. It does not start when a request already
waits on fd 3 (the session is not idle). The main thread kills it (SIGKILL) when it takes up
an execute or a restore, which is the moment they arrive (it has nothing else to do while the
child runs), and the control thread on a cancel_speculation naming it, or naming a
speculation still waiting for the main thread.

The child never writes to fds 3 to 5 (it closes them) nor to the host's output pipes: fds 1
and 2 are memfds, emptied before each snippet. It offers itself to the OOM killer first
(oom_score_adj 1000), leaves SIGINT to its default, makes display() collect and input() and
getpass() refuse. Each snippet, in order (see snippets for what is checked), is run as
execution runs a cell, compiled as the cell number it would have if the snippets ran for real
in order (``<cell-N>``, N = next cell number + index), and a snippet that binds names leaves
them bound for the later ones. What a snippet leaves behind inside the objects it read (a label
lookup builds an index's hash table, which a frame's memory usage then counts) is taken back
before the next one runs (see hidden), so a later snippet answers as its real run would, which
the earlier one does not precede. A snippet that leaves something that cannot be taken back
ends the child after its outcome ("finished", with the later snippets not run).
"""

import builtins
import getpass
import os
import resource
import signal
import threading
import time

from pyvisor_worker import display, execution, pages, protocol, snippets

_lock = threading.Lock()  # guards _live, _waiting_cancels and each child's flags
_live = None  # the running child
_waiting_cancels = {}  # ids of queued speculations cancelled before they started (ordered set)
_MAX_WAITING_CANCELS = 64

_CPU_SIGNALS = (signal.SIGPROF, signal.SIGXCPU)
_FAILURE_CHARS = 200  # of what a child says went wrong in its own code, kept for the host


class _Child:
    __slots__ = ("id", "pid", "cancelled", "exited")

    def __init__(self, speculation_id, pid):
        self.id = speculation_id
        self.pid = pid
        self.cancelled = False  # the worker killed it
        self.exited = False  # it has exited; its pid stays ours until it is reaped


def speculation_done(speculation_id, ending, cpu_ms):
    """The speculation_done message."""
    return {"type": "speculation_done", "id": speculation_id, "ending": ending,
            "cpu_ms": cpu_ms}


def cancel(speculation_id):
    """Kill the child of `speculation_id` (of any speculation, for None): the control thread's
    cancel_speculation, and the main thread's when it takes up an execute or a restore."""
    with _lock:
        child = _live
        if child is not None and speculation_id in (None, child.id):
            _kill(child)
        elif isinstance(speculation_id, str):
            _waiting_cancels[speculation_id] = None
            if len(_waiting_cancels) > _MAX_WAITING_CANCELS:
                del _waiting_cancels[next(iter(_waiting_cancels))]


def forget_in_clone():
    """In a clone of the session (see cloning): the source's speculation child is not its."""
    global _live, _lock
    _lock = threading.Lock()
    _live = None
    _waiting_cancels.clear()


def _kill(child):
    """SIGKILL `child`, unless it was killed or has exited; under _lock, so its pid is ours."""
    if not child.cancelled and not child.exited:
        child.cancelled = True
        os.kill(child.pid, signal.SIGKILL)


def speculate(request):
    """Main thread: start the speculation `request`; None, or its speculation_done when it
    cannot start (cancelled while it waited)."""
    global _live
    speculation_id, codes = request.get("id"), request.get("snippets")
    limits = [request.get(key) for key in ("repr_limit", "output_limit", "cpu_ms")]
    if (not isinstance(speculation_id, str) or not isinstance(codes, list)
            or not all(isinstance(code, str) for code in codes)
            or not all(isinstance(limit, int) and limit >= 0 for limit in limits)):
        raise TypeError("speculate request %r needs an id, snippets and limits"
                        % (speculation_id,))
    with _lock:
        if _live is not None:
            _kill(_live)
        cancelled = _waiting_cancels.pop(speculation_id, False) is None
        if cancelled or protocol.request_waiting():
            return speculation_done(speculation_id, "cancelled", 0.0)
    read_fd, write_fd = os.pipe()
    try:
        pid = execution.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:
        os.close(read_fd)
        _child_main(codes, limits, write_fd)
    os.close(write_fd)
    child = _Child(speculation_id, pid)
    with _lock:
        _live = child
        # A cancel of this speculation that came during the fork (an execute that came then
        # kills the child when the main thread takes it up).
        if _waiting_cancels.pop(speculation_id, False) is None:
            _kill(child)
    protocol.start_thread(_collect, child, read_fd)
    return None


def _collect(child, read_fd):
    """Thread: forward the outcomes of `child`, reap it, send speculation_done."""
    failure = None  # what the child said went wrong in its own code
    with open(read_fd, "rb") as pipe:
        for line in pipe:  # until the child exits
            if not line.endswith(b"\n"):  # cut short by its death
                break
            try:  # the child runs session code, which can write to this pipe too
                index, outcome = protocol.decode(line.decode("utf-8"))
            except (ValueError, TypeError):
                break
            if index is None:
                if isinstance(outcome, str):
                    failure = outcome[:_FAILURE_CHARS]
                continue
            protocol.send({"type": "speculated", "id": child.id, "index": index,
                           "outcome": outcome})
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # the session's code reaped it
        pass
    with _lock:
        child.exited = True  # from now on nothing kills that pid: it may be reused
        global _live
        if _live is child:
            _live = None
    try:
        _, status, usage = os.wait4(child.pid, 0)
    except ChildProcessError:
        protocol.send(speculation_done(child.id, "crashed: reaped by the session's code", 0.0))
        return
    started = time.thread_time()
    pages.reclaim()  # the child is gone: the next execution finds its pages writable
    cpu_ms = (usage.ru_utime + usage.ru_stime + time.thread_time() - started) * 1000
    protocol.send(speculation_done(child.id, _ending(child, status, failure), cpu_ms))


def _ending(child, status, failure):
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        if code == 0:
            return "finished"
        return "crashed: " + (failure or "exit status %d" % code)
    number = os.WTERMSIG(status)
    if child.cancelled and number == signal.SIGKILL:
        return "cancelled"
    if number in _CPU_SIGNALS:
        return "cpu_limit"
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "signal %d" % number
    return "crashed: killed by " + name


def _child_main(codes, limits, write_fd):
    """In the forked child: run the snippets, write each outcome to `write_fd`. Never returns."""
    status = 1
    try:
        repr_limit, output_limit, cpu_ms = limits
        protocol.close_protocol_fds()
        for fd in (1, 2):
            memfd = os.memfd_create("speculation-%d" % fd)
            os.dup2(memfd, fd)
            os.close(memfd)
        _contain(cpu_ms)
        import gc

        gc.freeze()  # collections leave the objects shared with the worker alone
        sink = []
        display.collect_displays(sink)
        builtins.input = getpass.getpass = snippets.refuse_input
        first = execution.next_number()
        with open(write_fd, "wb", buffering=0) as pipe:
            try:
                for index, code in enumerate(codes):
                    del sink[:]
                    outcome, faithful = snippets.run(code, "<cell-%d>" % (first + index),
                                                     repr_limit, output_limit, sink)
                    pipe.write(_line([index, outcome]))
                    if not faithful:
                        break  # the snippets after it would answer from what it left behind
            except Exception as exc:  # the worker's own fault: say which, for the host's log
                pipe.write(_line([None, "%s: %s" % (type(exc).__name__, exc)]))
                raise
        status = 0
    finally:
        os._exit(status)


def _line(record):
    return protocol.encode(record).encode("utf-8", "replace") + b"\n"


def _contain(cpu_ms):
    """Make this child the OOM killer's first choice and give it `cpu_ms` of CPU time."""
    try:
        with open("/proc/self/oom_score_adj", "w") as adjust:
            adjust.write("1000")
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for number in _CPU_SIGNALS:
        signal.signal(number, signal.SIG_DFL)
    used = resource.getrusage(resource.RUSAGE_SELF)
    seconds = used.ru_utime + used.ru_stime + cpu_ms / 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    limit = int(seconds) + 1
    if hard == resource.RLIM_INFINITY or limit < hard:
        resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))
    signal.setitimer(signal.ITIMER_PROF, max(cpu_ms, 1) / 1000)
