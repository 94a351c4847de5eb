"""The worker's entry: the command line, the set-up of a worker, and its main loop.

``run()`` starts a worker, or with ``--zygote`` the zygote (see zygote); ``main()`` makes the
process a session's worker and serves the host's requests until told to stop. A spawned
worker given ``--sandbox PLAN`` confines itself (see sandbox) before anything else runs.
"""

import builtins
import getpass
import json
import os
import signal
import sys

from pyvisor_worker import (
    adoption, bridge, checkpoints, cloning, completion, display, execution, inspection, pages,
    prompts, protocol, restores, sandbox, speculation, state, surroundings, zygote,
)

_USAGE = ("usage: python3 -I -B -u WORKER_DIRECTORY [--zygote] [--preload MODULE[,MODULE...]]"
          " [--sandbox PLAN]")


def run():
    """Start as the command line says: a worker, or with --zygote the zygote."""
    # Python puts the directory it runs first on sys.path, for this package to import, even
    # with -I, which leaves a script's own directory out: the session's code gets the sys.path
    # that a script would.
    home = os.path.dirname(os.path.dirname(__file__))
    if sys.path and os.path.normpath(sys.path[0]) == os.path.normpath(home):
        del sys.path[0]
    args = sys.argv[1:]
    is_zygote, preload, plan = False, [], None
    while args:
        arg = args.pop(0)
        if arg == "--zygote":
            is_zygote = True
        elif arg == "--preload" and args:
            preload += [name for name in args.pop(0).split(",") if name]
        elif arg == "--sandbox" and args:
            plan = json.loads(args.pop(0))
        else:
            sys.exit("pyvisor worker: unknown argument %r; %s" % (arg, _USAGE))
    del sys.argv[1:]
    if plan is not None:
        try:
            sandbox.confine(plan)
        except OSError as exc:
            sys.exit("pyvisor worker: confining the worker failed: %s" % (exc,))
    if is_zygote:
        zygote.zygote_main(preload, main)
    else:
        main(preload)


def main(preload=()):
    """Set the process up as a session's worker, say hello, and serve until told to stop."""
    for fd in (protocol.REQUEST_FD, protocol.REPLY_FD, protocol.CONTROL_FD):
        try:
            os.set_inheritable(fd, False)  # keep them from os.system() and subprocesses
        except OSError:
            sys.exit("pyvisor worker: fd %d is not open (pyvisor passes pipes as fds 3 to 5)" % fd)
    os.environ.setdefault("MPLBACKEND", "Agg")
    failure = zygote.preload(preload)
    if failure is not None:
        sys.exit("pyvisor worker: " + failure)
    signal.signal(signal.SIGINT, execution.on_sigint)
    sys.modules["__main__"] = state.session
    builtins.input = prompts.input
    builtins.display = display.display
    getpass.getpass = prompts.getpass
    os.register_at_fork(after_in_child=execution.after_fork_in_child)
    surroundings.install()
    _start_serving()
    _serve()


def _start_serving():
    """Start the thread that serves the control messages, and say hello (also in a clone)."""
    # A frame that comes before the control thread runs waits in the pipe.
    protocol.start_thread(protocol.read_control, execution.interrupt, inspection.inspect,
                          speculation.cancel, bridge)
    protocol.send({
        "type": "hello",
        "protocol": protocol.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "python_version": sys.version.split()[0],
        "executable": sys.executable,
        "capabilities": list(protocol.CAPABILITIES),
        **({"sandbox": sandbox.applied} if sandbox.applied is not None else {}),
    })


def _serve():
    """Main loop: read the requests of fd 3 and serve them in order."""
    arrived = None  # a request that came while the worker waited to compute facts
    while True:
        request = arrived if arrived is not None else protocol.next_request()
        kind = request.get("type")
        if kind in ("execute", "restore"):
            speculation.cancel(None)  # the CPU is theirs now
            pages.hold_off()
        try:
            if kind == "execute":
                reply = execution.execute(request)
            elif kind == "checkpoint":
                # None: a forked child writes it, and a thread replies
                reply = checkpoints.checkpoint(request)
            elif kind == "speculate":
                reply = speculation.speculate(request)  # None: a thread replies
            elif kind == "adopt":
                reply = adoption.adopt(request)
            elif kind == "counted":
                reply = adoption.counted(request)
            elif kind == "complete":
                reply = completion.complete(request)
            elif kind == "fork":
                reply = cloning.fork(request, _start_serving, _serve)  # None: it replied
            elif kind == "restore":
                reply = restores.restore(request)
            elif kind == "llm_enable":
                bridge.install()
                reply = None
            else:  # a request of a newer host: ignored, as the protocol says
                reply = None
        except BaseException as exc:
            reply = _fault_reply(request, exc)
        if reply is not None:
            protocol.send(reply)
        pages.go_on()
        arrived = execution.send_facts()


def _fault_reply(request, exc):
    """The reply to `request` when serving it failed with `exc`, a fault of the worker."""
    kind, request_id = request.get("type"), request.get("id")
    if kind == "execute":
        return execution.result(request_id, None, execution.worker_error(exc), changed=True)
    reason = execution.worker_error(exc)["message"]
    if kind == "checkpoint":
        return checkpoints.checkpoint_done(request_id, checkpoints.no_checkpoint(reason))
    if kind == "speculate":
        return speculation.speculation_done(request_id, "crashed: " + reason, 0.0)
    if kind == "adopt":
        return adoption.adopt_done(request_id, reason)
    if kind == "counted":  # nothing to answer: the host served it already
        return None
    if kind == "complete":
        return {"type": "complete_done", "id": request_id, "matches": []}
    if kind == "fork":
        return {"type": "forked", "id": request_id, "clones": [], "threads": 0, "error": reason}
    return {"type": "restore_done", "id": request_id, "restored": [], "kept": [], "lost": [],
            "error": reason}
