"""Finding a pyvisor to talk to: the daemon at a socket (the one given, else
``$PYVISOR_SOCKET``, else the CLI's default socket), and when none answers there, a
``pyvisor serve --stdio`` from ``PATH`` started as a child for the caller's lifetime, spoken
to over a socketpair that is the child's stdin and stdout.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import threading

from .client import Client
from .errors import ConnectError, ConnectionClosed


class Connection:
    """A client, and the ``pyvisor serve --stdio`` child it speaks to when there is one."""

    def __init__(self, client, child=None):
        self.client = client
        self.child = child

    def close(self, grace=10.0):
        """Closes the client; a child, which stops at the end of its stdin, is waited for
        `grace` seconds and then killed."""
        self.client.close()
        if self.child is not None:
            try:
                self.child.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()


def connect(path=None, startup_timeout=60.0):
    """A Connection to the daemon at `path` (else the default socket), else to a child
    ``pyvisor serve --stdio``; ConnectError when neither can be had."""
    try:
        return Connection(Client(path, connect_timeout=min(startup_timeout, 5.0)))
    except ConnectError as err:
        refused = err
    binary = shutil.which("pyvisor")
    if binary is None:
        raise ConnectError("%s, and there is no `pyvisor` on PATH to start one with "
                           "`pyvisor serve --stdio`" % refused)
    return Connection(*_spawn(binary, startup_timeout))


def _spawn(binary, startup_timeout):
    """(client, child) of a new ``pyvisor serve --stdio``, once it answers."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # Its log: warnings only, kept in an unlinked file for the error of a failed start.
    log = tempfile.TemporaryFile()
    env = dict(os.environ, PYVISOR_LOG=os.environ.get("PYVISOR_LOG", "warn"))
    try:
        child = subprocess.Popen([binary, "serve", "--stdio"], stdin=theirs, stdout=theirs,
                                 stderr=log, env=env, start_new_session=True)
    finally:
        theirs.close()
    client = Client.over(ours, "%s serve --stdio (pid %d)" % (binary, child.pid))
    # A child that never answers is killed, which ends the health call below.
    deadline = threading.Timer(startup_timeout, child.kill)
    deadline.start()
    try:
        client.health()
    except ConnectionClosed:
        client.close()
        child.kill()
        child.wait()
        log.seek(0)
        raise ConnectError("`pyvisor serve --stdio` exited or did not answer within %.0f s: %s"
                           % (startup_timeout, log.read().decode("utf-8", "replace")[-2000:]
                              or "no output")) from None
    finally:
        deadline.cancel()
        log.close()
    return client, child
