"""PyvisorREPL beside the rlms library's subprocess-kernel environment (``IPythonREPL`` with
``kernel_mode="subprocess"``, a Jupyter kernel per REPL), measured in one run on the same
machine:

1. environment start: construct the REPL, until it can run a cell;
2. ``execute_code("x = 1")``;
3. a cell of one ``llm_query`` round trip to the library's LM handler, in front of a loopback
   OpenAI-compatible server that answers at once;
4. an RLM completion of 100 iterations whose scripted model (the same loopback server) runs
   one small cell per iteration and answers at the last, and how much of it was spent in the
   environment's execute_code (the rest is mostly the openai client preparing each request
   of the growing conversation, the same for both).

    python3 clients/python/bench/rlm_envs.py [runs]

It starts its own daemon (``$PYVISOR_BIN``, else the workspace's target/debug/pyvisor) in a
temp home, with ``[llm] batch_window_ms = 0`` so a call is sent at once (the daemon's default
waits up to 10 ms to batch calls made together). The IPython kernel needs ipykernel and
jupyter_client: missing, they are installed into this interpreter's environment first.
"""

import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "clients" / "python" / "tests"))

for module, package in (("ipykernel", "ipykernel"), ("jupyter_client", "jupyter_client")):
    if importlib.util.find_spec(module) is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", package], check=True)

from rlm import RLM  # noqa: E402
from rlm.environments.ipython_repl import IPythonREPL  # noqa: E402

from openai_server import OpenAiServer  # noqa: E402
from pyvisor_client import Client, ConnectError  # noqa: E402
from pyvisor_client.rlm import PyvisorREPL, register  # noqa: E402

ITERATIONS = 100


def scripted(messages):
    """The sub-LLM echoes; the root model runs a cell per turn and answers at the last."""
    if len(messages) == 1:
        return "echo"
    turn = sum(m["role"] == "assistant" for m in messages)
    if turn < ITERATIONS - 1:
        return "```repl\nstep = %d\n```" % turn
    return "```repl\nanswer['content'] = str(step)\nanswer['ready'] = True\n```"


def start_daemon(home):
    for name in ("run", "config/pyvisor", "state", "cache"):
        (home / name).mkdir(parents=True, exist_ok=True)
    (home / "config" / "pyvisor" / "config.toml").write_text(
        "[pool]\nmin_idle = 2\n\n[llm]\nbatch_window_ms = 0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYVISOR_")}
    env.update(HOME=str(home), XDG_RUNTIME_DIR=str(home / "run"),
               XDG_CONFIG_HOME=str(home / "config"), XDG_STATE_HOME=str(home / "state"),
               XDG_CACHE_HOME=str(home / "cache"), PYVISOR_LOG="warn")
    binary = os.environ.get("PYVISOR_BIN") or str(REPO / "target" / "debug" / "pyvisor")
    socket = str(home / "run" / "pyvisor.sock")
    process = subprocess.Popen([binary, "serve", "--socket", socket], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(socket) as client:
                client.health()
            return process, socket
        except ConnectError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise
            time.sleep(0.05)


def timed(runs, once):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        once()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return samples


def fmt(samples):
    p99 = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
    return "%.2f ms p50 / %.2f ms p99" % (statistics.median(samples), p99)


def measure(name, make, environment, environment_kwargs, handler, provider, runs):
    starts = max(3, runs // 40)
    started = timed(starts, lambda: make().cleanup())
    with make(lm_handler_address=handler.address) as repl:
        assert "1" in repl.execute_code("x = 1\nprint(x)").stdout
        cell = timed(runs, lambda: repl.execute_code("x = 1"))
        answer = repl.execute_code("print(llm_query('hi'))").stdout
        assert answer == "echo\n", answer
        asked = timed(runs // 2, lambda: repl.execute_code("r = llm_query('hi')"))
    rlm = RLM(backend="openai", backend_kwargs=provider.backend_kwargs(),
              environment=environment, environment_kwargs=environment_kwargs,
              max_iterations=ITERATIONS)
    in_env = [0.0]
    cls = type(repl)
    original = cls.execute_code

    def execute_code(self, code):
        start = time.perf_counter()
        try:
            return original(self, code)
        finally:
            in_env[0] += time.perf_counter() - start

    cls.execute_code = execute_code
    try:
        start = time.perf_counter()
        result = rlm.completion("bench")
        loop = time.perf_counter() - start
    finally:
        cls.execute_code = original
    assert result.response == str(ITERATIONS - 2), result.response
    print("%-8s start %s (%d) | x = 1 %s | llm_query cell %s | %d-iteration RLM %.2f s, "
          "%.2f s of it in execute_code"
          % (name, fmt(started), starts, fmt(cell), fmt(asked), ITERATIONS, loop, in_env[0]),
          flush=True)
    return (statistics.median(started), statistics.median(cell), statistics.median(asked),
            loop, in_env[0])


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    register()
    provider = OpenAiServer(scripted)
    handler = provider.lm_handler()
    home = Path(tempfile.mkdtemp(prefix="pyvisor-rlm-bench-"))
    daemon, socket = start_daemon(home)
    try:
        ipython = measure(
            "ipython", lambda **kw: IPythonREPL(kernel_mode="subprocess", **kw), "ipython",
            {"kernel_mode": "subprocess"}, handler, provider, runs)
        pyvisor = measure(
            "pyvisor", lambda **kw: PyvisorREPL(socket=socket, **kw), "pyvisor",
            {"socket": socket}, handler, provider, runs)
        print("ipython / pyvisor: start %.0fx, x = 1 %.1fx, llm_query cell %.1fx, RLM run %.1fx,"
              " its execute_code %.1fx" % tuple(i / p for i, p in zip(ipython, pyvisor)))
    finally:
        handler.stop()
        provider.stop()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)


if __name__ == "__main__":
    main()
