"""Preloading modules, and the zygote: a fork server of workers with those modules imported.

Preload: ``--preload pandas,numpy`` on the command line imports those modules before the hello,
so that the session's code finds them in sys.modules. When one fails to import, the worker
writes a line naming it to fd 2 and exits with status 1 before saying hello. sys.argv is cut
back to its first item, so the code sees the same sys.argv however the worker was started.

Zygote mode: ``--zygote --preload pandas`` makes this process a fork server for workers with
those modules imported. Its fd 3 is a Unix SOCK_SEQPACKET socket to the host; its fds 0, 1 and
2 are /dev/null. Each message is one datagram holding one JSON object, unframed. The zygote
imports the modules, compiles once (the first compile() of a process is slow), stops the garbage
collector and freezes what it has (gc.freeze(), so the children's collections leave the shared
pages alone), then serves the host, single-threaded: forking a process that has threads is
unsafe. Host -> zygote:

    {"type": "fork", "id": 1, "cwd": "/dir" | null, "env": [["NAME", "value"]],
     "rlimits": [{"resource": "nofile", "soft": 256, "hard": 256}], "sandbox": {...}}

with the child's fds 0-5 (stdin, stdout, stderr, request pipe, reply pipe, control pipe)
attached as SCM_RIGHTS. A "resource" is the lowercase name of an RLIMIT_* constant. Zygote -> host:

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
that the group exists when "forked" is sent), moves the six fds onto 0-5, closes every other
fd, sets the rlimits, working directory and environment, restores the signal handling of a
fresh worker, confines itself as the request's "sandbox" plan says (see sandbox; the zygote
stays root, each child takes its own uid) and turns the garbage collector back on. Then it
waits for one frame on fd 3:

    {"type": "start"}

which the host sends once it has registered the child for cleanup and put it in its cgroup, so
that no code runs before the child is contained; end of file instead (the host gave up or
died) makes it exit 0. From there on it is a worker like any other: it says hello and serves.
"""

import os
import signal
import traceback

from pyvisor_worker import pickling, protocol, sandbox

ZYGOTE_FD = 3  # the zygote's control socket
CHILD_FDS = 6  # a forked child's stdin, stdout, stderr, request, reply and control pipes


def preload(modules):
    """Import `modules`; describe the first that fails to import, or return None."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            return "preload module %r failed to import: %s: %s" % (name, type(exc).__name__, exc)
    return None


def zygote_main(modules, worker_main):
    """Zygote mode: import `modules`, then hand a waiting worker to each fork request.

    A forked child, once started, runs `worker_main()`, which serves as a worker.
    """
    # Every module the zygote and its children use is imported here, once, for all of them.
    import fcntl
    import gc
    import resource
    import select
    import socket

    # No collections from here on: they would leave holes in the pages the children share.
    gc.disable()
    server = _ForkServer(socket.socket(fileno=ZYGOTE_FD), worker_main)
    os.environ.setdefault("MPLBACKEND", "Agg")
    failure = preload(modules)
    if failure is not None:
        server.send({"type": "failed", "reason": failure})
        os._exit(1)
    compile("x = 1\nx", "<pyvisor-zygote>", "exec", dont_inherit=True)
    pickling.pickler_base()  # so that no forked worker's first checkpoint imports cloudpickle
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

    def __init__(self, control, worker_main):
        import select

        self.control = control
        self.worker_main = worker_main  # what a started child runs
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
            self.control.send(protocol.encode(message).encode("utf-8", "replace"))
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
            request = protocol.decode(data.decode("utf-8"))
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
        protocol.flush_output()
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
            order = (protocol.decode(data.decode("utf-8")), fds)
        request, fds = order
        # Out of the way of 0-5 first, so that no dup2() overwrites a descriptor still needed.
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
        if request.get("sandbox") is not None:
            sandbox.confine(request["sandbox"])
        gc.enable()
    except BaseException as exc:
        os.write(2, ("pyvisor worker: setting up the forked worker failed: %s: %s\n"
                     % (type(exc).__name__, exc)).encode("utf-8", "replace"))
        os._exit(1)
    start = protocol.read_message()  # end of file: the host gave up on this child, which exits
    if start is None or start.get("type") != "start":
        os._exit(1)
    try:
        server.worker_main()
    finally:
        protocol.exit_worker(1)
