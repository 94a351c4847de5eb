"""The synchronous socket client against a real daemon: state, streaming, input(), the
typed errors of bad calls, timeouts, interrupts, checkpoints, hints and the context managers."""

import base64
import threading
import time

import pytest

from pyvisor_client import (
    CheckpointNotFound, Client, ConnectError, ConnectionClosed, ExecutionTimeout, InvalidParams, MethodNotFound,
    PythonError, SessionBusy, UnknownSession,
)


def test_state_persists_between_runs_and_the_value_is_the_final_expression(session):
    assert session.run("x = 6 * 7").ok
    result = session.run("x")
    assert result.value == "42"
    assert result.result["type"] == "int"
    assert result.execution_count == 2


def test_streamed_output_arrives_in_order_through_the_callbacks(session):
    chunks = []
    result = session.run(
        "import sys\nprint('one')\nsys.stderr.write('two\\n')\nprint('three')",
        on_stdout=lambda text: chunks.append(("out", text)),
        on_stderr=lambda text: chunks.append(("err", text)))
    assert result.ok, result
    assert "".join(text for kind, text in chunks if kind == "out") == "one\nthree\n"
    assert ("err", "two\n") in chunks
    # Streamed output is in the result too.
    assert result.stdout == "one\nthree\n"


def test_a_hinted_cell_is_computed_ahead_and_answered_from_the_cache(session):
    session.run("xs = list(range(10))")
    assert session.hint(["sum(xs) * 2", "not python ("]) == 1
    deadline = time.monotonic() + 30
    while "sum(xs)*2" not in session.info()["proactive"]["ahead"]:
        assert time.monotonic() < deadline, "the hint was never computed ahead"
        time.sleep(0.02)
    result = session.run("sum(xs) * 2")
    assert result.value == "90"
    assert result.from_cache
    with pytest.raises(InvalidParams):
        session.hint(["1"] * 65)


def test_display_reaches_on_display_as_png(session):
    shown = []
    result = session.run(
        "class Dot:\n"
        "    def _repr_png_(self):\n"
        "        return b'\\x89PNG\\r\\n\\x1a\\nfake'\n"
        "display(Dot())",
        on_display=shown.append)
    assert result.ok, result
    assert [item.mime for item in shown] == ["image/png"]
    assert shown[0].bytes() == b"\x89PNG\r\n\x1a\nfake"
    assert base64.b64decode(result.display[0].data) == b"\x89PNG\r\n\x1a\nfake"


def test_input_round_trip_passes_the_prompt_and_returns_the_answer(session):
    asked = []

    def answer(prompt, password):
        asked.append((prompt, password))
        return "ada" if not password else "s3cret"

    result = session.run(
        "import getpass\nname = input('name? ')\nword = getpass.getpass('word? ')\n"
        "print('hi', name, len(word))",
        on_input=answer)
    assert result.ok, result
    assert asked == [("name? ", False), ("word? ", True)]
    assert "hi ada 6" in result.stdout


def test_input_answered_with_none_raises_eoferror_in_the_code(session):
    result = session.run("input('q? ')", on_input=lambda prompt, password: None)
    assert result.status == "error"
    assert result.error["type"] == "EOFError"


def test_input_without_streaming_raises_eoferror_at_once(session):
    result = session.run("input('q? ')")
    assert result.error["type"] == "EOFError"
    with pytest.raises(PythonError) as raised:
        result.raise_for_status()
    assert raised.value.result is result


def test_a_missing_session_raises_unknown_session(client):
    with pytest.raises(UnknownSession) as raised:
        client.session("no-such-session")
    assert raised.value.code == -32001
    session = client.create_session()
    session.close()
    with pytest.raises(UnknownSession):
        session.run("1")


def test_bad_params_raise_invalid_params_naming_the_field(client, session):
    with pytest.raises(InvalidParams) as raised:
        client.create_session(limits={"memory_mb": "lots"})
    assert "limits.memory_mb" in str(raised.value)
    with pytest.raises(InvalidParams) as raised:
        client.call("session.execute", {"session_id": session.session_id, "code": 5})
    assert "code" in raised.value.message
    with pytest.raises(InvalidParams):
        session.run("1", transaction="sometimes")
    with pytest.raises(MethodNotFound):
        client.call("session.teleport", {})
    # The connection still serves after the errors.
    assert session.run("2 + 2").value == "4"


def test_a_timeout_ends_the_execution_and_raises_on_request(session):
    result = session.run("import time\ntime.sleep(60)", timeout=0.5)
    assert result.status == "timeout"
    assert result.error["type"] == "KeyboardInterrupt"
    with pytest.raises(ExecutionTimeout):
        result.raise_for_status()
    # The session goes on.
    assert session.run("'alive'").value == "'alive'"


def test_interrupt_from_another_thread_stops_a_blocking_sleep(session):
    started = threading.Event()
    results = []
    runner = threading.Thread(target=lambda: results.append(session.run(
        "import time\nprint('sleeping', flush=True)\ntime.sleep(60)",
        on_stdout=lambda text: started.set())))
    runner.start()
    assert started.wait(60), "the code never started"
    assert session.interrupt() is True
    runner.join(60)
    assert results and results[0].status == "interrupted", results
    assert session.interrupt() is False


def test_a_second_execution_that_will_not_queue_gets_session_busy(client, session):
    started = threading.Event()
    runner = threading.Thread(target=lambda: session.run(
        "import time\nprint('go', flush=True)\ntime.sleep(60)",
        on_stdout=lambda text: started.set()))
    runner.start()
    try:
        assert started.wait(60)
        # Another connection: this one's streaming execution of the session is in flight.
        with Client(client.path) as other:
            with pytest.raises(SessionBusy):
                other.session(session.session_id).run("1", queue=False)
    finally:
        session.interrupt()
        runner.join(60)


def test_checkpoint_and_restore_bring_a_value_back(session):
    session.run("x = 1")
    first = session.checkpoint()
    assert "x" in first["saved"]
    session.run("x = 2")
    second = session.checkpoint()
    # Newest first (automatic checkpoints may sit between them).
    listed = [entry["checkpoint_id"] for entry in session.checkpoints()]
    assert listed.index(second["checkpoint_id"]) < listed.index(first["checkpoint_id"])
    restored = session.restore(first["checkpoint_id"])
    assert restored["checkpoint_id"] == first["checkpoint_id"]
    assert session.run("x").value == "1"
    with pytest.raises(CheckpointNotFound):
        session.restore("c-999999")


def test_context_managers_close_the_session_and_the_connection(daemon):
    with Client(daemon.socket) as client:
        with client.create_session(name="ctx") as session:
            assert session.created["attached"] is False
            assert client.create_session(name="ctx").created["attached"] is True
            session_id = session.session_id
        with pytest.raises(UnknownSession):
            client.session(session_id)
    with pytest.raises(ConnectionClosed):
        client.health()


def test_info_and_list_describe_the_session(client, session):
    session.run("def f(a):\n    return a + 1\nvalue = f(1)")
    info = session.info()
    assert info["session_id"] == session.session_id
    assert {"name": "value", "type": "int"}.items() <= next(
        v for v in info["variables"] if v["name"] == "value").items()
    assert [d["name"] for d in info["definitions"]] == ["f"]
    assert info["limits"]["timeout_s"] > 0
    ids = [entry["session_id"] for entry in client.list_sessions()]
    assert session.session_id in ids
    assert client.stats()["sessions"] >= 1


def test_no_daemon_raises_connect_error(tmp_path):
    with pytest.raises(ConnectError):
        Client(str(tmp_path / "nothing.sock"))


def test_many_threads_stream_on_one_connection_each_getting_its_own_output(client):
    sessions = [client.create_session() for _ in range(3)]
    streamed = {index: [] for index in range(3)}
    values = {}

    def work(index, session):
        result = session.run("print('session', %d)\nsum(range(%d))" % (index, index * 10),
                             on_stdout=streamed[index].append)
        values[index] = result.value

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert values == {i: str(sum(range(i * 10))) for i in range(3)}
    assert {i: "".join(chunks) for i, chunks in streamed.items()} == {
        i: "session %d\n" % i for i in range(3)}
    for session in sessions:
        session.close()
    listed = [entry["session_id"] for entry in client.list_sessions()]
    assert not any(session.session_id in listed for session in sessions)
