"""PyvisorREPL's environment contract of the rlms library, against a real daemon: execution
and results, context and history versioning, custom tools, the reserved names, the answer
dict, SHOW_VARS, input(), validation, the life cycle, and finding the daemon."""

import pytest

pytest.importorskip("rlm")

from rlm.environments import SupportsCustomTools, SupportsPersistence  # noqa: E402

from pyvisor_client import ConnectError  # noqa: E402
from pyvisor_client.rlm import PyvisorREPL  # noqa: E402


@pytest.fixture
def make(daemon):
    """Builds PyvisorREPLs on the test daemon; cleans them up at the end."""
    made = []

    def make(**kwargs):
        kwargs.setdefault("socket", daemon.socket)
        repl = PyvisorREPL(**kwargs)
        made.append(repl)
        return repl

    yield make
    for repl in made:
        repl.cleanup()


def test_cells_share_a_namespace_and_report_output_errors_and_simple_locals(make):
    repl = make()
    first = repl.execute_code("a = 40\nprint('printed')\nimport os")
    assert (first.stdout, first.stderr) == ("printed\n", "")
    result = repl.execute_code("b = a + 2\nnested = {'k': [1, 2.5, None, True]}\nclass C: pass\n"
                               "obj = C()\nbig = 'x' * 100000\nb")
    assert result.stdout == "42\n"  # the final expression, as an IPython kernel shows it
    assert result.locals["b"] == 42 and result.locals["nested"] == {"k": [1, 2.5, None, True]}
    # Objects, modules and values past the size limit are not simple values.
    assert not {"obj", "C", "os", "big"} & set(result.locals)
    assert result.execution_time > 0 and result.rlm_calls == [] and result.final_answer is None
    failed = repl.execute_code("1 / 0")
    assert "ZeroDivisionError" in failed.stderr and failed.stdout == ""
    assert "42" in repl.execute_code("print(b)").stdout


def test_context_and_history_are_versioned_copies_and_aliases_come_back(make):
    repl = make(context_payload={"name": "alice", "count": 7}, persistent=True)
    assert isinstance(repl, SupportsPersistence) and isinstance(repl, SupportsCustomTools)
    assert "alice 7" in repl.execute_code("print(context['name'], context['count'])").stdout
    assert repl.add_context("Second") == 1 and repl.get_context_count() == 2
    assert repl.add_context("Fifth", 4) == 4 and repl.get_context_count() == 5
    history = [{"role": "user", "content": "original"}]
    assert repl.add_history(history) == 0
    history[0]["content"] = "mutated"
    assert repl.add_history([{"role": "user", "content": "Q2"}]) == 1
    assert repl.get_history_count() == 2
    out = repl.execute_code("print(context_1, context_4, history_0[0]['content'], "
                            "history_1[0]['content'], history[0]['content'])").stdout
    assert out == "Second Fifth original Q2 original\n"
    repl.execute_code("context = 'overwritten'\nhistory = None")
    after = repl.execute_code("print(context['name'], history[0]['content'])")
    assert after.stdout == "alice original\n"
    assert after.locals["context"] == {"name": "alice", "count": 7}
    # A string context is the string itself, and a long one crosses in several cells.
    long_text = "0123456789" * 500_000
    index = repl.add_context(long_text)
    assert repl.execute_code("len(context_%d), context_%d[-3:]" % (index, index)).stdout == \
        "(5000000, '789')\n"


def test_custom_tools_callables_run_in_the_rlm_process_and_data_is_copied(make):
    seen = []

    def greet(name, punctuation="!"):
        seen.append(name)
        return {"greeting": "hello, " + name + punctuation}

    def broken():
        raise KeyError("nope")

    repl = make(custom_tools={"greet": {"tool": greet, "description": "says hello"},
                              "broken": broken, "MAGIC": 42, "TABLE": {"a": [1, 2]}})
    result = repl.execute_code("print(greet('world', punctuation='?')['greeting'], MAGIC * 2, "
                               "TABLE['a'])")
    assert result.stdout == "hello, world? 84 [1, 2]\n" and seen == ["world"]
    failed = repl.execute_code("broken()")
    assert "RuntimeError: custom tool broken failed: KeyError: 'nope'" in failed.stderr
    # Rebinding a tool lasts one cell, as for the reserved names.
    repl.execute_code("greet = 1\nMAGIC = 0")
    assert repl.execute_code("print(MAGIC, greet('again')['greeting'])").stdout == \
        "42 hello, again!\n"
    assert "greet" not in result.locals and result.locals["MAGIC"] == 42


@pytest.mark.parametrize("name", ["llm_query", "rlm_query_batched", "answer", "context",
                                  "SHOW_VARS", "history"])
def test_reserved_names_are_refused_as_custom_tools(daemon, name):
    with pytest.raises(ValueError, match="reserved"):
        PyvisorREPL(socket=daemon.socket, custom_tools={name: 1})


def test_answer_dict_show_vars_input_and_the_restored_scaffold(make):
    repl = make()
    assert repl.execute_code("x = 1").final_answer is None
    ready = repl.execute_code("answer['content'] = 'forty-two'\nanswer['ready'] = True")
    assert ready.final_answer == "forty-two"
    assert repl.execute_code("y = 2").final_answer is None  # surfaced once
    # Rebound to a plain dict that is ready: still the final answer, and re-wrapped.
    plain = repl.execute_code("answer = {'content': 7, 'ready': True}")
    assert plain.final_answer == "7"
    assert repl.execute_code("answer['content'] = 'z'; answer['ready'] = True").final_answer \
        == "z"
    shown = repl.execute_code("print(SHOW_VARS())").stdout
    assert "'x': 'int'" in shown and "'y': 'int'" in shown and "answer" not in shown
    refused = repl.execute_code("input('name? ')")
    assert "input() is disabled" in refused.stderr
    repl.execute_code("llm_query = None\nSHOW_VARS = 3\ninput = print")
    again = repl.execute_code("print(callable(llm_query), SHOW_VARS().startswith('Available'))"
                              "\ninput()")
    assert again.stdout == "True True\n" and "input() is disabled" in again.stderr


def test_arguments_are_validated_as_the_reference_does(daemon):
    with pytest.raises(ValueError, match="startup_timeout"):
        PyvisorREPL(socket=daemon.socket, startup_timeout=0)
    with pytest.raises(ValueError, match="subcall_timeout"):
        PyvisorREPL(socket=daemon.socket, subcall_timeout=0)
    with PyvisorREPL(socket=daemon.socket, cell_timeout=-1, depth=2,
                     lm_handler_address=("127.0.0.1", 5000), persistent=True) as repl:
        assert repl.cell_timeout is None and repl.depth == 2
        repl.update_handler_address(("127.0.0.1", 6000))
        assert repl.lm_handler_address == ("127.0.0.1", 6000)
    # setup_code runs as the first cell.
    with PyvisorREPL(socket=daemon.socket, setup_code="import math\nz = math.floor(2.5)") as repl:
        assert repl.execute_code("z").stdout == "2\n"


def test_cleanup_is_idempotent_and_closes_the_session(daemon, client):
    repl = PyvisorREPL(socket=daemon.socket)
    session_id = repl.session.session_id
    repl.execute_code("x = 1")
    repl.cleanup()
    repl.cleanup()
    assert session_id not in {s["session_id"] for s in client.list_sessions()}
    with pytest.raises(RuntimeError, match="cleaned up"):
        repl.execute_code("x")


def test_the_socket_comes_from_pyvisor_socket_when_not_given(daemon, monkeypatch):
    monkeypatch.setenv("PYVISOR_SOCKET", daemon.socket)
    with PyvisorREPL() as repl:
        assert repl.execute_code("print(6 * 7)").stdout == "42\n"


def test_without_any_pyvisor_the_error_says_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConnectError, match="no `pyvisor` on PATH"):
        PyvisorREPL(socket=str(tmp_path / "none.sock"))
