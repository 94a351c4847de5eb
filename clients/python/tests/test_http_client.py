"""The HTTP client against a real daemon's HTTP API: the Session API over REST routes, the
same typed errors, and streaming refused rather than faked."""

import pytest

from pyvisor_client import (
    ConnectError, HttpClient, InvalidParams, PyvisorError, UnknownSession,
)


@pytest.fixture
def http(daemon):
    return HttpClient(daemon.http)


def test_runs_keep_state_over_http(http):
    with http.create_session(name="over-http") as session:
        assert session.run("x = 20").ok
        result = session.run("x * 2 + 2")
        assert result.value == "42"
        assert http.session("over-http").session_id == session.session_id
        assert session.info()["execution_count"] == 2


def test_http_errors_are_the_typed_exceptions_of_their_codes(http):
    with pytest.raises(UnknownSession) as raised:
        http.session("nobody")
    assert raised.value.code == -32001
    with pytest.raises(InvalidParams):
        http.create_session(limits={"timeout_s": "soon"})


def test_http_timeout_interrupt_and_checkpoints(http):
    with http.create_session() as session:
        assert session.run("import time\ntime.sleep(60)", timeout=0.5).status == "timeout"
        assert session.interrupt() is False
        session.run("y = 3")
        taken = session.checkpoint()
        session.run("y = 4")
        session.restore(taken["checkpoint_id"])
        assert session.run("y").value == "3"
        listed = [entry["checkpoint_id"] for entry in session.checkpoints()]
        assert taken["checkpoint_id"] in listed


def test_input_over_http_raises_eoferror_and_callbacks_are_refused(http):
    with http.create_session() as session:
        assert session.run("input()").error["type"] == "EOFError"
        with pytest.raises(PyvisorError, match="cannot stream"):
            session.run("print(1)", on_stdout=print)


def test_no_daemon_at_the_url_raises_connect_error():
    with pytest.raises(ConnectError):
        HttpClient("http://127.0.0.1:9", timeout=5).health()
