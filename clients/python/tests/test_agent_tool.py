"""examples/agent_tool.py against a fake OpenAI-compatible server on loopback that speaks
chat completions with a scripted tool call, and a real daemon running the tool's code."""

import importlib.util
import json

import pytest

from chat_server import ChatServer
from conftest import REPO


def load_agent_tool():
    spec = importlib.util.spec_from_file_location("agent_tool", REPO / "examples" / "agent_tool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_chat(script):
    """A chat server that answers each request with the next scripted message."""
    script = list(script)
    return ChatServer(lambda body: script.pop(0))


def tool_call(call_id, code):
    return {"id": call_id, "type": "function",
            "function": {"name": "run_python", "arguments": json.dumps({"code": code})}}


@pytest.fixture
def agent_tool():
    return load_agent_tool()


def test_the_tool_definition_is_a_function_with_a_json_schema(agent_tool):
    function = agent_tool.RUN_PYTHON["function"]
    assert agent_tool.RUN_PYTHON["type"] == "function"
    assert function["parameters"]["required"] == ["code"]
    assert function["parameters"]["properties"]["code"]["type"] == "string"


def test_the_loop_runs_the_models_tool_calls_in_one_session(agent_tool, session):
    fake = fake_chat([
        {"role": "assistant", "content": None,
         "tool_calls": [tool_call("call-1", "def fib(n):\n    a, b = 0, 1\n"
                                            "    for _ in range(n):\n        a, b = b, a + b\n"
                                            "    return a\nprint('defined')")]},
        {"role": "assistant", "content": None,
         "tool_calls": [tool_call("call-2", "fib(20)"), tool_call("call-3", "1/0")]},
        {"role": "assistant", "content": "The 20th Fibonacci number is 6765."},
    ])
    try:
        answer = agent_tool.agent("What is fib(20)?", session, fake.url, "test-key", "m")
    finally:
        fake.stop()
    assert answer == "The 20th Fibonacci number is 6765."
    assert len(fake.requests) == 3
    path, authorization, first = fake.requests[0]
    assert path == "/v1/chat/completions"
    assert authorization == "Bearer test-key"
    assert first["tools"] == [agent_tool.RUN_PYTHON]
    tools = {m["tool_call_id"]: m["content"] for m in fake.requests[2][2]["messages"]
             if m["role"] == "tool"}
    assert tools["call-1"] == "defined\n"
    # The second call used what the first defined: the session persisted.
    assert tools["call-2"] == "6765"
    assert "ZeroDivisionError" in tools["call-3"]


def test_a_bad_tool_call_is_answered_not_run(agent_tool, session):
    message = agent_tool.call_tool(session, {"id": "c", "function": {
        "name": "run_python", "arguments": "not json"}})
    assert "JSON object" in message["content"]
    message = agent_tool.call_tool(session, {"id": "d", "function": {"name": "rm_rf"}})
    assert "unknown tool" in message["content"]
    assert session.info()["execution_count"] == 0
