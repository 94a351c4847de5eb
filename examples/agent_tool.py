"""An LLM that uses a persistent pyvisor session as a tool: a function-calling tool
definition (JSON schema) and a minimal loop over an OpenAI-compatible chat completions API,
with urllib only.

    export OPENAI_API_KEY=...            # or any OpenAI-compatible server's key
    python3 examples/agent_tool.py "What is the 20th Fibonacci number?"

The model gets one tool, ``run_python``; each call runs in the same session, so names
defined by one call are there for the next. The tool's answer is what a person at a Python
prompt would see: the output, the value of a final expression, or the error. Settings:
``--base-url`` (``$OPENAI_BASE_URL``, default https://api.openai.com/v1), ``--model``
(``$OPENAI_MODEL``, default gpt-4o-mini), ``--socket`` (else the daemon's default socket).
Needs a running daemon (``pyvisor daemon start``) and ``pip install ./clients/python``.
"""

import argparse
import json
import os
import sys
import urllib.request

from pyvisor_client import Client

RUN_PYTHON = {
    "type": "function",
    "function": {
        "name": "run_python",
        "description": (
            "Run Python code in a persistent session: variables, imports and functions stay "
            "defined between calls. Returns what the code printed, the value of its last "
            "expression, and any error with its traceback."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The Python code to run."},
                "timeout_s": {
                    "type": "number",
                    "description": "Seconds the code may run (default 30).",
                },
            },
            "required": ["code"],
            "additionalProperties": False,
        },
    },
}

SYSTEM = ("You can run Python with the run_python tool. Use it for anything you would "
          "otherwise compute in your head, then answer briefly.")

# The most of one tool answer sent back to the model, in characters.
MAX_TOOL_ANSWER = 20_000


def tool_answer(result):
    """The text the model gets for an execution: output, value or error, as at a prompt."""
    parts = []
    if result.stdout:
        parts.append(result.stdout)
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr)
    if result.value is not None:
        parts.append(result.value)
    if result.error:
        parts.append("".join(result.error.get("traceback") or [])
                     or "%s: %s" % (result.error["type"], result.error["message"]))
    if result.status not in ("ok", "error"):
        parts.append("[execution %s]" % result.status)
    text = "\n".join(parts) or "[no output]"
    if len(text) > MAX_TOOL_ANSWER:
        text = text[:MAX_TOOL_ANSWER] + "\n[... cut]"
    return text


def call_tool(session, call):
    """Runs one tool call of the model; the tool message that answers it."""
    function = call.get("function") or {}
    if function.get("name") != "run_python":
        content = "unknown tool %r; the only tool is run_python" % function.get("name")
    else:
        try:
            arguments = json.loads(function.get("arguments") or "{}")
            code = arguments["code"]
        except (ValueError, KeyError, TypeError):
            content = "the arguments must be a JSON object with a string \"code\""
        else:
            content = tool_answer(session.run(code, timeout=arguments.get("timeout_s")))
    return {"role": "tool", "tool_call_id": call.get("id"), "content": content}


def chat(base_url, api_key, model, messages):
    """One chat completion request; the assistant message of its first choice."""
    body = json.dumps({"model": model, "messages": messages, "tools": [RUN_PYTHON]})
    request = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions", data=body.encode("utf-8"), method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + api_key})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())["choices"][0]["message"]


def agent(question, session, base_url, api_key, model, max_turns=10):
    """Asks the model `question`, running its tool calls in `session`, until it answers."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    for _ in range(max_turns):
        reply = chat(base_url, api_key, model, messages)
        messages.append(reply)
        calls = reply.get("tool_calls") or []
        if not calls:
            return reply.get("content") or ""
        messages.extend(call_tool(session, call) for call in calls)
    raise RuntimeError("no answer after %d turns" % max_turns)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("question")
    parser.add_argument("--base-url",
                        default=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"))
    parser.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    parser.add_argument("--socket", default=None)
    args = parser.parse_args(argv)
    api_key = os.environ.get("OPENAI_API_KEY", "")
    with Client(args.socket) as client, client.create_session() as session:
        print(agent(args.question, session, args.base_url, api_key, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
