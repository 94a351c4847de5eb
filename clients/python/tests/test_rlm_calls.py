"""PyvisorREPL's model calls: llm_query through the client-answered bridge to the rlms LM
handler (in front of a local OpenAI-compatible server), rlm_query to subcall_fn bounded by
max_concurrent_subcalls, calls attributed to their own cell, cell_timeout, and the attack:
session code never learns the handler's address and, without network, cannot reach it."""

import re
import threading

import pytest

pytest.importorskip("rlm")

from rlm.core.types import ModelUsageSummary, RLMChatCompletion, UsageSummary  # noqa: E402

from openai_server import OpenAiServer, last_user_text  # noqa: E402
from pyvisor_client.rlm import PyvisorREPL  # noqa: E402


@pytest.fixture(scope="module")
def provider():
    server = OpenAiServer(lambda messages: "echo:" + last_user_text(messages))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def handler(provider):
    handler = provider.lm_handler()
    yield handler
    handler.stop()


def completion(prompt, response):
    usage = UsageSummary({"sub-model": ModelUsageSummary(1, 0, 0)})
    return RLMChatCompletion(root_model="sub-model", prompt=prompt, response=response,
                             usage_summary=usage, execution_time=0.001)


def test_llm_queries_reach_the_lm_handler_and_count_in_their_cell(daemon, handler, provider):
    with PyvisorREPL(socket=daemon.socket, lm_handler_address=handler.address) as repl:
        result = repl.execute_code("one = llm_query('hello')\n"
                                   "many = llm_query_batched(['a', 'b'])\n"
                                   "fallback = rlm_query('no subcall_fn')\n"
                                   "print(one, many, fallback)")
        assert result.stdout == "echo:hello ['echo:a', 'echo:b'] echo:no subcall_fn\n"
        assert [c.response for c in result.rlm_calls] == [
            "echo:hello", "echo:a", "echo:b", "echo:no subcall_fn"]
        assert repl.execute_code("x = 1").rlm_calls == []
        # Prompts that are lists of messages reach the handler as they are.
        messages = repl.execute_code(
            "print(llm_query([{'role': 'user', 'content': 'as messages'}]),\n"
            "      llm_query_batched(['plain', [{'role': 'user', 'content': 'listed'}]]))")
        assert messages.stdout == "echo:as messages ['echo:plain', 'echo:listed']\n"
        assert len(messages.rlm_calls) == 3
        # The address changes between completions of a persistent RLM.
        repl.update_handler_address(("127.0.0.1", 9))
        refused = repl.execute_code("print(llm_query('q'))")
        assert refused.stdout.startswith("Error: ") and refused.rlm_calls == []
        repl.update_handler_address(None)
        assert repl.execute_code("print(llm_query_batched(['q']))").stdout == \
            "['Error: No LM handler configured']\n"
    assert {"role": "user", "content": "hello"} in [
        m for body in provider.bodies() for m in body["messages"]]


def test_rlm_query_batched_calls_subcall_fn_at_most_max_concurrent_at_once(daemon):
    lock = threading.Lock()
    in_flight = [0]
    peak = [0]
    pairs = threading.Barrier(2, timeout=30)  # two at once must happen for the batch to end

    def subcall_fn(prompt, model):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            if prompt != "single":
                pairs.wait()
            return completion(prompt, "child:" + prompt + ":" + str(model))
        finally:
            with lock:
                in_flight[0] -= 1

    with PyvisorREPL(socket=daemon.socket, subcall_fn=subcall_fn,
                     max_concurrent_subcalls=2) as repl:
        result = repl.execute_code(
            "print(rlm_query_batched(['p%d' % i for i in range(6)], model='m'))\n"
            "print(rlm_query('single'))")
    assert result.stderr == ""
    assert result.stdout.splitlines()[0] == str(["child:p%d:m" % i for i in range(6)])
    assert peak[0] == 2
    assert [c.prompt for c in result.rlm_calls][:6] == ["p%d" % i for i in range(6)]
    assert len(result.rlm_calls) == 7


def test_a_stale_subcall_is_not_counted_in_the_next_cell(daemon):
    release = threading.Event()
    finished = []

    def subcall_fn(prompt, model):
        if prompt == "slow":
            release.wait(30)
            finished.append(prompt)
        return completion(prompt, "answer:" + prompt)

    with PyvisorREPL(socket=daemon.socket, subcall_fn=subcall_fn, cell_timeout=1) as repl:
        timed_out = repl.execute_code("stale = rlm_query('slow')")
        assert "TimeoutError: cell execution exceeded 1s" in timed_out.stderr
        assert timed_out.rlm_calls == []
        release.set()
        assert repl.wait_for_calls(30) and finished == ["slow"]
        fresh = repl.execute_code("print(rlm_query('fast'), 'stale' in globals())")
        assert fresh.stdout == "answer:fast False\n"
        assert [c.prompt for c in fresh.rlm_calls] == ["fast"]


def test_subcall_timeout_gives_up_on_a_slow_subcall(daemon):
    release = threading.Event()

    def subcall_fn(prompt, model):
        release.wait(30)
        return completion(prompt, "late")

    with PyvisorREPL(socket=daemon.socket, subcall_fn=subcall_fn, subcall_timeout=0.3) as repl:
        result = repl.execute_code("print(rlm_query('slow'))")
        release.set()
        assert result.stdout == \
            "Error: RLM query failed - no answer within subcall_timeout (0.3s)\n"
        assert result.rlm_calls == [] and repl.wait_for_calls(30)


def test_cell_timeout_interrupts_sleep_and_the_repl_keeps_its_state(daemon):
    with PyvisorREPL(socket=daemon.socket, cell_timeout=0.5) as repl:
        repl.execute_code("kept = 'yes'")
        result = repl.execute_code("import time\ntime.sleep(60)")
        assert "TimeoutError: cell execution exceeded 0.5s and was interrupted" in result.stderr
        assert repl.execute_code("print('still-alive', kept)").stdout == "still-alive yes\n"


def test_a_cell_that_ignores_the_interrupt_is_killed_and_comes_back_with_its_state(daemon):
    stubborn = ("import time\nwhile True:\n    try:\n        time.sleep(10)\n"
                "    except KeyboardInterrupt:\n        pass")
    with PyvisorREPL(socket=daemon.socket, cell_timeout=0.5,
                     checkpoint_every_cell=True) as repl:
        repl.execute_code("kept = 'yes'")
        result = repl.execute_code(stubborn)
        assert "TimeoutError: cell execution exceeded 0.5s" in result.stderr
        assert "the cell was killed; the REPL came back from checkpoint" in result.stderr
        assert repl.execute_code("print(kept)").stdout == "yes\n"


def test_subcall_fn_calling_back_into_its_repl_is_refused_not_deadlocked(daemon):
    holder = {}

    def subcall_fn(prompt, model):
        return holder["repl"].execute_code("1")

    with PyvisorREPL(socket=daemon.socket, subcall_fn=subcall_fn) as repl:
        holder["repl"] = repl
        result = repl.execute_code("print(rlm_query('loop'))")
    assert result.stdout.startswith("Error: RLM query failed - Reentrant execute_code")


def test_session_code_never_holds_the_handler_address_nor_reaches_it(daemon, handler,
                                                                     provider):
    host, port = handler.address
    # Everything the session can see, gathered before any code names the port.
    gather = (
        "import builtins, gc, os\n"
        "seen = [repr(os.environ), open('/proc/self/cmdline', 'rb').read().decode(),\n"
        "        open('/proc/self/environ', 'rb').read().decode(errors='replace')]\n"
        "for holder in (globals(), vars(builtins)):\n"
        "    for value in list(holder.values()):\n"
        "        seen.append(repr(value))\n"
        "        for cell in getattr(value, '__closure__', None) or ():\n"
        "            seen.append(repr(cell.cell_contents))\n"
        "seen += [repr(o) for o in gc.get_objects() if isinstance(o, (tuple, list, dict))]\n"
        "text = '\\n'.join(seen)\n"
        "print(llm_query('still answered'))\n")
    # Then an attacker who guessed the port.
    attack = (
        "import re, socket\n"
        "found = bool(re.search(r'\\b%d\\b', text))\n"
        "try:\n"
        "    socket.create_connection((%r, %d), timeout=5).close()\n"
        "    reached = 'connected'\n"
        "except OSError as err:\n"
        "    reached = type(err).__name__\n"
        "print(len(text) > 10000, found, reached)\n" % (port, host, port))
    with PyvisorREPL(socket=daemon.socket, lm_handler_address=handler.address,
                     network=False) as repl:
        before = len(provider.requests)
        result = repl.execute_code(gather)
        assert result.stdout == "echo:still answered\n", result.stderr
        looked, found, reached = repl.execute_code(attack).stdout.split()
        assert (looked, found) == ("True", "False")
        assert reached != "connected"
        assert len(provider.requests) == before + 1  # only the adapter's own request
