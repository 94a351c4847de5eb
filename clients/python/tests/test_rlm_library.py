"""PyvisorREPL under the rlms library itself: register() and RLM(environment="pyvisor")
completions whose model is a scripted local OpenAI-compatible server (one-shot, persistent
multi-turn, a nested rlm_query), then what the reference cannot do: a segfaulting cell
answered with the state restored, a restarted run attaching to its REPL by name, and the
child `pyvisor serve --stdio` when no daemon answers."""

import re

import pytest

pytest.importorskip("rlm")

from rlm import RLM  # noqa: E402

from conftest import REPO, Daemon, wait_for  # noqa: E402
from openai_server import OpenAiServer  # noqa: E402
from pyvisor_client import rlm as pyvisor_rlm  # noqa: E402
from pyvisor_client.rlm import PyvisorREPL  # noqa: E402

# What the scripted root model does once it has seen its newest context.
ACTIONS = {
    "task-llm": "x = llm_query('sub')\nanswer['content'] = x.upper()\nanswer['ready'] = True",
    "turn-1": "kept = 41\nanswer['content'] = 'stored'\nanswer['ready'] = True",
    "turn-2": "answer['content'] = '%d %s %s' % (kept + 1, context_0, history[0]['role'])\n"
              "answer['ready'] = True",
    "task-parent": "r = rlm_query('task-child')\nanswer['content'] = 'parent got ' + r\n"
                   "answer['ready'] = True",
    "task-child": "answer['content'] = 'child-done'\nanswer['ready'] = True",
}


def scripted_model(messages):
    """A sub-LLM call (one message) is echoed. A root model first prints its newest context
    (the user prompt says how many there are), then runs the action of what it saw."""
    if len(messages) == 1:
        return "echo:" + messages[0]["content"]
    seen = re.findall(r"CTX=([\w-]+)", "\n".join(m["content"] for m in messages[1:]))
    if seen and any(m["role"] == "assistant" for m in messages):
        return "Acting.\n```repl\n%s\n```" % ACTIONS[seen[-1]]
    contexts = re.findall(r"You have (\d+) contexts", messages[-1]["content"])
    newest = int(contexts[-1]) - 1 if contexts else 0
    return "Looking.\n```repl\nprint('CTX' + '=' + str(context_%d))\n```" % newest


@pytest.fixture(scope="module")
def provider():
    server = OpenAiServer(scripted_model)
    yield server
    server.stop()


def rlm_of(provider, daemon, **options):
    pyvisor_rlm.register()
    return RLM(backend="openai", backend_kwargs=provider.backend_kwargs(),
               environment="pyvisor", environment_kwargs={"socket": daemon.socket},
               max_iterations=6, **options)


def test_an_rlm_completion_runs_in_pyvisor_after_register(provider, daemon, client):
    before = {s["session_id"] for s in client.list_sessions()}
    result = rlm_of(provider, daemon).completion("task-llm")
    assert result.response == "ECHO:SUB"
    # The sub-LLM call went through the handler to the provider; the session is closed.
    assert any(b["messages"] == [{"role": "user", "content": "sub"}] for b in provider.bodies())
    assert {s["session_id"] for s in client.list_sessions()} == before
    pyvisor_rlm.register()  # a second call changes nothing
    assert rlm_of(provider, daemon).completion("task-llm").response == "ECHO:SUB"


def test_persistent_multi_turn_keeps_the_repl_between_completions(provider, daemon):
    with rlm_of(provider, daemon, persistent=True) as rlm:
        assert rlm.completion("turn-1").response == "stored"
        env = rlm._persistent_env
        assert isinstance(env, PyvisorREPL) and env.get_context_count() == 1
        assert rlm.completion("turn-2").response == "42 turn-1 system"
        assert env.get_context_count() == 2 and env.get_history_count() == 2
        assert rlm._persistent_env is env
    assert env.session is None  # RLM.close cleaned it up


def test_rlm_query_spawns_a_child_rlm_in_its_own_pyvisor_repl(provider, daemon):
    result = rlm_of(provider, daemon, max_depth=2).completion("task-parent")
    assert result.response == "parent got child-done"


def test_a_segfaulting_cell_is_answered_and_the_state_is_restored(daemon):
    with PyvisorREPL(socket=daemon.socket, checkpoint_every_cell=True,
                     context_payload="ctx") as repl:
        repl.execute_code("x = 1")
        repl.execute_code("y = [x, 2]")
        crashed = repl.execute_code("import ctypes\nctypes.string_at(0)")
        assert "WorkerCrashed" in crashed.stderr and "SIGSEGV" in crashed.stderr
        after = repl.execute_code("print(x, y, context)\n"
                                  "answer['content'] = 'ok'\nanswer['ready'] = True")
        assert after.stdout == "1 [1, 2] ctx\n" and after.final_answer == "ok"
        # A name that cannot be saved is reported, and does not fail loading a context.
        unsaved = repl.execute_code("numbers = (i for i in range(3))")
        assert unsaved.stderr == "\n[pyvisor] not checkpointed: numbers"
        assert repl.add_context("more") == 1


def test_a_restarted_run_attaches_to_its_repl_by_name(daemon):
    first = PyvisorREPL(socket=daemon.socket, session_name="rlm-restart", persistent=True,
                        checkpoint_every_cell=True)
    try:
        first.add_context("one")
        first.add_history([{"role": "user", "content": "hi"}])
        first.execute_code("progress = 3")
        # The run dies without cleaning up: its connection just ends.
        first._connection.close()
        with PyvisorREPL(socket=daemon.socket, session_name="rlm-restart",
                         persistent=True) as second:
            assert second.session.created["attached"]
            assert (second.get_context_count(), second.get_history_count()) == (1, 1)
            assert second.add_context("two") == 1
            assert second.execute_code("print(progress, context, context_1)").stdout == \
                "3 one two\n"
    finally:
        first.cleanup()


def test_a_run_resumes_its_repl_from_checkpoints_after_the_daemon_restarts(tmp_path):
    daemon = Daemon(tmp_path)
    try:
        first = PyvisorREPL(socket=daemon.socket, session_name="rlm-resume", persistent=True,
                            checkpoint_every_cell=True, context_payload="one")
        first.execute_code("progress = [1, 2]")
    finally:
        daemon.stop()  # the RLM's process and the daemon both go away
    first.cleanup()
    daemon = Daemon(tmp_path)
    try:
        with PyvisorREPL(socket=daemon.socket, session_name="rlm-resume",
                         persistent=True) as second:
            assert second.session.created["restored"]
            assert second.get_context_count() == 1
            assert second.execute_code("print(progress, context)").stdout == "[1, 2] one\n"
    finally:
        daemon.stop()


def test_without_a_daemon_it_starts_pyvisor_serve_stdio(tmp_path, monkeypatch):
    for name in ("HOME", "XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
                 "XDG_CACHE_HOME"):
        (tmp_path / name).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name))
    monkeypatch.delenv("PYVISOR_SOCKET", raising=False)
    monkeypatch.setenv("PATH", "%s:%s" % (REPO / "target" / "debug",
                                          __import__("os").environ["PATH"]))
    repl = PyvisorREPL(startup_timeout=60)
    child = repl._connection.child
    assert child is not None
    assert repl.execute_code("print(sum(range(100)))").stdout == "4950\n"
    repl.cleanup()
    wait_for(lambda: child.poll() is not None, 30, "the child daemon to exit")
