"""A real ``pyvisor serve`` for the client's tests: the binary the workspace built (or
``$PYVISOR_BIN``), in a private home under a temp dir, listening on a Unix socket and on
HTTP at a loopback port it picks itself; stopped with SIGTERM at the end.
"""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pyvisor_client import Client, ConnectError

REPO = Path(__file__).resolve().parents[3]
STARTUP = 60.0


def wait_for(condition, limit, what):
    """Polls `condition` until it is true, for at most `limit` seconds."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting for " + what)


class Daemon:
    def __init__(self, home):
        self.home = home
        self.socket = str(home / "run" / "pyvisor.sock")
        self.log = home / "daemon.log"
        binary = os.environ.get("PYVISOR_BIN") or str(REPO / "target" / "debug" / "pyvisor")
        for name in ("run", "config/pyvisor", "state", "cache"):
            (home / name).mkdir(parents=True, exist_ok=True)
        (home / "config" / "pyvisor" / "config.toml").write_text("[pool]\nmin_idle = 1\n[proactive]\nyield_to_load = false\n")
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("PYVISOR_")}
        env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home / "run"),
                   XDG_CONFIG_HOME=str(home / "config"), XDG_STATE_HOME=str(home / "state"),
                   XDG_CACHE_HOME=str(home / "cache"), PYVISOR_LOG="info")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [binary, "serve", "--socket", self.socket, "--http", "127.0.0.1:0"],
                cwd=home, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=log)
        self.http = wait_for(self._http_address, STARTUP, "the daemon's HTTP address")
        wait_for(self._answers, STARTUP, "the daemon's socket")

    def _http_address(self):
        if self.process.poll() is not None:
            raise AssertionError("pyvisor serve exited: " + self.log.read_text())
        found = re.search(r"HTTP on (http://\S+) ", self.log.read_text())
        return found and found.group(1)

    def _answers(self):
        try:
            with Client(self.socket) as client:
                return client.health()["status"] == "ok"
        except ConnectError:
            return False

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    daemon = Daemon(tmp_path_factory.mktemp("pyvisor-home"))
    yield daemon
    daemon.stop()


@pytest.fixture
def client(daemon):
    with Client(daemon.socket) as client:
        yield client


@pytest.fixture
def session(client):
    with client.create_session() as session:
        yield session
