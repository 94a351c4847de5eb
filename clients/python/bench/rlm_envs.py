"""PyvisorREPL beside the rlms library's subprocess-kernel environment (``IPythonREPL`` with
``kernel_mode="subprocess"``, a Jupyter kernel per REPL), measured in one run on the same
machine:

0. the environment contract as 19 cases that each build a fresh REPL, as the library's own
   environment tests do: how many pass, and the time of the whole set;
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
jupyter_client, and dill for custom tools that are functions: missing, they are installed
into this interpreter's environment first.
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

for module, package in (("ipykernel", "ipykernel"), ("jupyter_client", "jupyter_client"),
                        ("dill", "dill")):
    if importlib.util.find_spec(module) is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", package], check=True)

from rlm import RLM  # noqa: E402
from rlm.core.types import ModelUsageSummary, RLMChatCompletion, UsageSummary  # noqa: E402
from rlm.environments import SupportsPersistence  # noqa: E402
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


def completion(prompt, response):
    usage = UsageSummary({"sub": ModelUsageSummary(1, 0, 0)})
    return RLMChatCompletion(root_model="sub", prompt=prompt, response=response,
                             usage_summary=usage, execution_time=0.0)


def contract_cases():
    """The environment contract as cases that each build a fresh REPL (as the library's own
    environment tests do): (name, case(make)), where make(**kwargs) builds the environment."""
    def output(make, code, **kwargs):
        with make(**kwargs) as repl:
            return repl.execute_code(code)

    def persistent(make, steps):
        with make(persistent=True) as repl:
            return steps(repl)

    def versions(repl):
        assert (repl.add_context("First"), repl.add_context("Second")) == (0, 1)
        return repl.execute_code("print(context_0, context_1, context)").stdout

    def histories(repl):
        history = [{"role": "user", "content": "Q1"}]
        repl.add_history(history)
        history[0]["content"] = "mutated"
        repl.add_history([{"role": "user", "content": "Q2"}])
        return repl.execute_code("print(history_0[0]['content'], history_1[0]['content'], "
                                 "history[0]['content'])").stdout

    def alias(repl):
        repl.add_context("original")
        repl.execute_code("context = 'overwritten'")
        return repl.execute_code("print(context_0)").stdout

    def timeout(make):
        with make(cell_timeout=0.5) as repl:
            stopped = repl.execute_code("import time; time.sleep(5)")
            return stopped.stderr, repl.execute_code("print('still-alive')").stdout

    def cleanup(make):
        repl = make()
        repl.execute_code("x = 1")
        repl.cleanup()
        repl.cleanup()
        return True

    def handler_address(make):
        with make(lm_handler_address=("127.0.0.1", 5000), persistent=True) as repl:
            repl.update_handler_address(("127.0.0.1", 6000))
            return repl.lm_handler_address

    def subcalls(make, code, responses):
        calls = []

        def subcall_fn(prompt, model=None):
            calls.append(prompt)
            return completion(prompt, responses[(len(calls) - 1) % len(responses)])

        result = output(make, code, subcall_fn=subcall_fn)
        return result.stdout, len(calls), len(result.rlm_calls)

    return [
        ("simple execution", lambda make: "3" in output(make, "x = 1 + 2\nprint(x)").stdout),
        ("error in stderr", lambda make: "ZeroDivisionError" in output(make, "1 / 0").stderr),
        ("persistence", lambda make: persistent(
            make, lambda r: (r.execute_code("a = 40"), r.execute_code("b = a + 2"),
                             r.execute_code("print(b)"))[2].stdout) == "42\n"),
        ("answer dict", lambda make: output(
            make, "answer['content'] = 'done'\nanswer['ready'] = True").final_answer == "done"),
        ("context str", lambda make: "11" in output(
            make, "print(len(context))", context_payload="hello world").stdout),
        ("context dict", lambda make: "alice 7" in output(
            make, "print(context['name'], context['count'])",
            context_payload={"name": "alice", "count": 7}).stdout),
        ("tool callable", lambda make: "hello, world" in output(
            make, "print(greet('world'))",
            custom_tools={"greet": lambda name: "hello, " + name}).stdout),
        ("tool data", lambda make: "84" in output(
            make, "print(MAGIC * 2)", custom_tools={"MAGIC": 42}).stdout),
        ("rlm_query", lambda make: subcalls(
            make, "print(rlm_query('think'))", ["child"]) == ("child\n", 1, 1)),
        ("rlm_query_batched", lambda make: subcalls(
            make, "print(','.join(rlm_query_batched(['a', 'b', 'c'])))",
            ["x", "y", "z"])[1:] == (3, 3)),
        ("rlm_query fallback", lambda make: "Error" in output(
            make, "print(rlm_query('hi'))").stdout),
        ("timeout", lambda make: (lambda err, out: "TimeoutError" in err
                                  and "still-alive" in out)(*timeout(make))),
        ("no timeout", lambda make: "4950" in output(make, "print(sum(range(100)))").stdout),
        ("cleanup twice", cleanup),
        ("persistence protocol", lambda make: persistent(
            make, lambda r: isinstance(r, SupportsPersistence))),
        ("context versions", lambda make: persistent(make, versions) == "First Second First\n"),
        ("history versions", lambda make: persistent(make, histories) == "Q1 Q2 Q1\n"),
        ("handler address", lambda make: handler_address(make) == ("127.0.0.1", 6000)),
        ("context alias", lambda make: persistent(make, alias) == "original\n"),
    ]


def run_cases(name, make):
    """Runs every contract case on fresh environments; (passed, failed names, seconds)."""
    failed = []
    start = time.perf_counter()
    for case, check in contract_cases():
        try:
            ok = check(make)
        except Exception as err:  # a case that raises has failed; say which
            ok = False
            print("%s: %s raised %r" % (name, case, err), file=sys.stderr)
        if not ok:
            failed.append(case)
    seconds = time.perf_counter() - start
    print("%-8s %d contract cases: %d passed in %.2f s%s"
          % (name, len(contract_cases()), len(contract_cases()) - len(failed), seconds,
             " (failed: %s)" % ", ".join(failed) if failed else ""), flush=True)
    return seconds


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    register()
    provider = OpenAiServer(scripted)
    handler = provider.lm_handler()
    home = Path(tempfile.mkdtemp(prefix="pyvisor-rlm-bench-"))
    daemon, socket = start_daemon(home)
    try:
        ipython_cases = run_cases("ipython", lambda **kw: IPythonREPL(kernel_mode="subprocess",
                                                                      **kw))
        pyvisor_cases = run_cases("pyvisor", lambda **kw: PyvisorREPL(socket=socket, **kw))
        print("contract cases: pyvisor takes %.1f%% of the ipython time"
              % (100 * pyvisor_cases / ipython_cases))
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
