"""Forking the session: clones of the worker, namespace and all, each to serve as a session of
its own.

A fork request ({"type": "fork", "id", "count", "plans"?}) is taken up by the main thread
between executions, so a running execution is finished first. For each clone the worker makes five
pipes (the clone's stdout, stderr, requests, replies and control) and forks; it puts the child in a
process group of its own and closes its copies of the pipes. It answers

    {"type": "forked", "id", "clones": [{"pid", "stdout", "stderr", "requests", "replies",
     "control"}], "threads": N, "error": null | "why there are fewer clones than asked for"}

where the five numbers are the descriptors, in the clone, of the host's ends of its pipes:
the host opens them through /proc/<pid>/fd (the clone's pipes are never the source's), puts
the clone in a cgroup of its own, then sends {"type": "start"} on its new request pipe. Until
then the clone runs nothing; end of file instead (the host gave up) makes it exit 0.

The clone moves its ends onto fds 1 to 5, forgets what belonged to the source (an interrupt
kept for it, its speculation child, a held write lock), closes the host's ends once started,
isolates itself from its source and siblings when the request gave it a plan ("plans", one
per clone, under Landlock: see sandbox.isolate_clone; a clone that cannot be isolated says why
on its stderr and exits before any session code runs) and says hello as a new worker does; from there on it is a worker like any other. The
source stays the clone's parent: one thread of the source (the reaper, started at the first
fork) waits for every clone, so that a clone closed or killed does not stay behind as a
zombie counted against the source. The reaper learns of new clones only after the reply has
gone: starting a thread, or waking one, in the middle of a fork makes the main thread wait
for the GIL behind it, which cost a fork up to 20 ms on a busy machine. Only the
thread that forked exists in a clone: threads of the session's code do not survive, and when
the source had any, the clone's first execution says so on its stderr. Open files stay open
in both, sharing their offsets; the working directory is the source's, or with a plan a copy
of it of the clone's own.
"""

import collections
import os
import select
import sys
import threading

from pyvisor_worker import execution, pages, protocol, sandbox, speculation, state


def user_threads():
    """Threads of the session's code running now (the worker's own are not threading's)."""
    main = threading.main_thread()
    return [thread for thread in threading.enumerate()
            if thread is not main and not isinstance(thread, threading._DummyThread)]


def fork(request, hello, serve):
    """Serve a fork request, replying to it. A clone runs `hello()` then `serve()` and never
    returns here."""
    request_id, count = request.get("id"), request.get("count")
    if type(count) is not int or not 1 <= count <= 16:
        raise TypeError("fork request %r needs a count from 1 to 16" % (request_id,))
    plans = request.get("plans") or [None] * count
    if len(plans) != count:
        raise TypeError("fork request %r has %d plans for %d clones" % (request_id, len(plans), count))
    threads = len(user_threads())
    clones, watched, error = [], [], None
    for plan in plans:
        try:
            clone, pidfd = _fork_one(threads, plan, hello, serve)
        except OSError as exc:
            error = "fork: %s" % (exc,)
            break
        clones.append(clone)
        watched.append((clone["pid"], pidfd))
    try:
        protocol.send({"type": "forked", "id": request_id, "clones": clones,
                       "threads": threads, "error": error})
    finally:
        _reaper.watch(watched)


def _fork_one(threads, plan, hello, serve):
    """Fork one clone, isolated as `plan` says when there is one; what the host needs to know
    of it, and a pidfd of it (None where the kernel has none)."""
    # stdout, stderr, requests, replies, control: (read, write)
    pipes = [os.pipe() for _ in range(5)]
    try:
        pid = execution.fork()
    except OSError:
        for read, write in pipes:
            os.close(read)
            os.close(write)
        raise
    (out_r, out_w), (err_r, err_w), (req_r, req_w), (rep_r, rep_w), (ctl_r, ctl_w) = pipes
    if pid == 0:
        try:
            _become_clone((out_w, err_w, req_r, rep_w, ctl_r), (out_r, err_r, req_w, rep_r, ctl_w),
                          threads, plan, hello, serve)
        finally:
            os._exit(1)
    pidfd = _reaper.open(pid)  # at once: nothing can have waited for the clone yet
    try:
        os.setpgid(pid, pid)  # the group exists before the host hears of it
    except OSError:
        pass  # the child made it already, or died: the host finds out
    for read, write in pipes:
        os.close(read)
        os.close(write)
    clone = {"pid": pid, "stdout": out_r, "stderr": err_r, "requests": req_w, "replies": rep_r,
             "control": ctl_w}
    return clone, pidfd


class _Reaper:
    """The source's thread that waits for its clones to end (closed, or killed).

    It polls a pidfd per clone and a wake pipe; `watch` hands it new clones. A pidfd names
    one process, so a clone that the session's own code waited for (os.wait()) is never
    confused with a later child that got its pid. A clone without a pidfd (Linux before 5.3)
    gets a waiting thread of its own instead.
    """

    def __init__(self):
        self.arrived = collections.deque()  # (pid, pidfd), from the main thread to the reaper
        self.wake = None  # (read, write) ends of the pipe that wakes the reaper
        self.pidfds = set()  # every pidfd open, so that a clone can close its source's

    def open(self, pid):
        """A pidfd of the child `pid`, or None where the kernel has none."""
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return None
        self.pidfds.add(pidfd)
        return pidfd

    def watch(self, clones):
        """Wait from now on for `clones`, (pid, pidfd or None) of clones just forked."""
        for pid, pidfd in clones:
            if pidfd is None:
                protocol.start_thread(_wait_for, pid)
            else:
                self.arrived.append((pid, pidfd))
        if not self.arrived:
            return
        if self.wake is None:
            self.wake = os.pipe()
            protocol.start_thread(self._serve, self.wake[0])
        os.write(self.wake[1], b"+")

    def forget_in_clone(self):
        """In a clone: the source's reaper, its pipe and its pidfds of the clone's siblings
        are not the clone's (threads do not survive a fork); the clone starts a reaper of its
        own at its first fork."""
        for fd in (self.wake or ()) + tuple(self.pidfds):
            try:
                os.close(fd)
            except OSError:
                pass
        self.__init__()

    def _serve(self, wake):
        poller = select.poll()
        poller.register(wake, select.POLLIN)
        pids = {}  # pidfd -> pid
        while True:
            for fd, _ in poller.poll():
                if fd == wake:
                    os.read(wake, 512)
                    while self.arrived:
                        pid, pidfd = self.arrived.popleft()
                        pids[pidfd] = pid
                        poller.register(pidfd, select.POLLIN)
                    continue
                pid = pids.pop(fd)
                poller.unregister(fd)
                try:
                    os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
                except ChildProcessError:
                    pass  # the session's own code waited for it (os.wait())
                except OSError:  # Linux 5.3 has pidfds but cannot wait on them
                    _wait_for(pid)
                finally:
                    self.pidfds.discard(fd)
                    os.close(fd)


def _wait_for(pid):
    """Wait for the clone `pid` to end, where it has no pidfd to wait on."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # the session's own code waited for it (os.wait())


_reaper = _Reaper()


def _become_clone(ours, hosts, threads, plan, hello, serve):
    """In the child: take the new pipes, wait for the start frame, isolate the clone as
    `plan` says, and serve as a worker."""
    os.setpgid(0, 0)
    _reaper.forget_in_clone()
    for fd, target in zip(ours, (1, 2, protocol.REQUEST_FD, protocol.REPLY_FD,
                                 protocol.CONTROL_FD)):
        os.dup2(fd, target, inheritable=target < protocol.REQUEST_FD)
        os.close(fd)
    # What the source had in flight is not the clone's.
    execution.after_fork_in_clone()
    speculation.forget_in_clone()
    pages.forget_in_clone()
    protocol.reset_in_clone()
    request = protocol.read_message()
    if not request or request.get("type") != "start":
        os._exit(0)
    for fd in hosts:
        os.close(fd)
    notes = []
    if threads:
        notes.append("[pyvisor] this session is a fork: %d thread(s) of the session's code were "
                     "running in the source and do not run here\n" % threads)
    if plan is None:
        sandbox.shared_clone()
    else:
        try:
            skipped = sandbox.isolate_clone(plan)
        except BaseException as exc:
            os.write(2, ("pyvisor worker: isolating the clone failed: %s\n" % (exc,))
                     .encode("utf-8", "replace"))
            os._exit(1)
        if skipped:
            path, reason = skipped[0]
            notes.append("[pyvisor] this session is a fork: %d item(s) of the source's work "
                         "directory were not copied into its own (%s: %s%s)\n"
                         % (len(skipped), path, reason, ", ..." if len(skipped) > 1 else ""))
    state.fork_note = "".join(notes) or None
    hello()
    serve()
    os._exit(0)
