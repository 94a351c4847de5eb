"""Forking the session: clones of the worker, namespace and all, each to serve as a session of
its own.

A fork request ({"type": "fork", "id", "count"}) is taken up by the main thread between
executions, so a running execution is finished first. For each clone the worker makes four
pipes (the clone's stdout, stderr, requests and replies) and forks; it puts the child in a
process group of its own and closes its copies of the pipes. It answers

    {"type": "forked", "id", "clones": [{"pid", "stdout", "stderr", "requests", "replies"}],
     "threads": N, "error": null | "why there are fewer clones than asked for"}

where the four numbers are the descriptors, in the clone, of the host's ends of its pipes:
the host opens them through /proc/<pid>/fd (the clone's pipes are never the source's), puts
the clone in a cgroup of its own, then sends {"type": "start"} on its new request pipe. Until
then the clone runs nothing; end of file instead (the host gave up) makes it exit 0.

The clone moves its ends onto fds 1 to 4, forgets what belonged to the source (the requests
queued for it, its speculation child, a held write lock), closes the host's ends once started
and says hello as a new worker does; from there on it is a worker like any other. The
source stays the clone's parent: a thread of the source waits for each clone, so that a
clone closed or killed does not stay behind as a zombie counted against the source. Only the
thread that forked exists in a clone: threads of the session's code do not survive, and when
the source had any, the clone's first execution says so on its stderr. Open files stay open
in both, sharing their offsets; the working directory is the source's.
"""

import os
import sys
import threading

from pyvisor_worker import execution, protocol, speculation, state


def user_threads():
    """Threads of the session's code running now (the worker's own are not threading's)."""
    main = threading.main_thread()
    return [thread for thread in threading.enumerate()
            if thread is not main and not isinstance(thread, threading._DummyThread)]


def fork(request, hello, serve):
    """Serve a fork request; the reply. A clone runs `hello()` then `serve()` and never
    returns here."""
    request_id, count = request.get("id"), request.get("count")
    if type(count) is not int or not 1 <= count <= 16:
        raise TypeError("fork request %r needs a count from 1 to 16" % (request_id,))
    threads = len(user_threads())
    clones, error = [], None
    for _ in range(count):
        try:
            clones.append(_fork_one(threads, hello, serve))
        except OSError as exc:
            error = "fork: %s" % (exc,)
            break
    return {"type": "forked", "id": request_id, "clones": clones, "threads": threads,
            "error": error}


def _fork_one(threads, hello, serve):
    """Fork one clone; what the host needs to know of it."""
    pipes = [os.pipe() for _ in range(4)]  # stdout, stderr, requests, replies: (read, write)
    try:
        pid = execution.fork()
    except OSError:
        for read, write in pipes:
            os.close(read)
            os.close(write)
        raise
    (out_r, out_w), (err_r, err_w), (req_r, req_w), (rep_r, rep_w) = pipes
    if pid == 0:
        try:
            _become_clone((out_w, err_w, req_r, rep_w), (out_r, err_r, req_w, rep_r), threads,
                          hello, serve)
        finally:
            os._exit(1)
    try:
        os.setpgid(pid, pid)  # the group exists before the host hears of it
    except OSError:
        pass  # the child made it already, or died: the host finds out
    protocol.start_thread(_reap, pid)
    for read, write in pipes:
        os.close(read)
        os.close(write)
    return {"pid": pid, "stdout": out_r, "stderr": err_r, "requests": req_w, "replies": rep_r}


def _reap(pid):
    """Thread of the source: wait for the clone `pid` to end (closed, or killed)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # the session's own code waited for it (os.wait())


def _become_clone(ours, hosts, threads, hello, serve):
    """In the child: take the new pipes, wait for the start frame, and serve as a worker."""
    os.setpgid(0, 0)
    for fd, target in zip(ours, (1, 2, protocol.REQUEST_FD, protocol.REPLY_FD)):
        os.dup2(fd, target, inheritable=target < protocol.REQUEST_FD)
        os.close(fd)
    # What the source had in flight is not the clone's.
    execution.after_fork_in_clone()
    speculation.forget_in_clone()
    protocol.reset_in_clone()
    request = protocol.read_message()
    if not request or request.get("type") != "start":
        os._exit(0)
    for fd in hosts:
        os.close(fd)
    if threads:
        state.fork_note = ("[pyvisor] this session is a fork: %d thread(s) of the session's code "
                        "were running in the source and do not run here\n" % threads)
    hello()
    serve()
    os._exit(0)
