"""The LLM bridge: ``llm_query``, ``llm_query_batched`` and ``rlm_query`` for the session's code,
answered by the host, which holds the key, chooses the endpoint and keeps the budget; the
session never sees any of them, and nothing it sends can raise its budget or depth: a call
carries only prompts, a model name and a context.

The host gives a worker the bridge with ``{"type": "llm_enable"}`` before any execute; the
functions and their exceptions (``LlmError``, and ``BudgetExceeded``, a kind of it) then
become builtins. A worker never enabled has none of these names.

A call, from any thread, while an execution runs:

    {"type": "llm_call", "id": "e-1", "call": 7, "kind": "llm" | "llm_batched" | "rlm",
     "prompts": ["..."], "model": null | "small", "context": <any JSON, rlm only>}

and the calling thread waits for the reply that the control thread routes to it:

    {"type": "llm_reply", "call": 7, "answers": ["..."],
     "error": null | {"kind": "LlmError" | "BudgetExceeded", "message": "..."}}

The wait is an ordinary blocking get, so an interrupt of the execution raises
KeyboardInterrupt in it; the host cancels the calls of an execution when it ends, which
answers any thread still waiting with an LlmError.
"""

import builtins
import itertools
import json
import queue
import threading

from pyvisor_worker import protocol, state


class LlmError(Exception):
    """An LLM call of the session's code got no answer."""


class BudgetExceeded(LlmError):
    """An LLM call was refused: the budget it would spend is used up."""


_lock = threading.Lock()
_numbers = itertools.count(1)
_waiting = {}  # call number -> the queue its thread waits on


def install():
    """Main thread: give the session's code the bridge, as builtins."""
    builtins.llm_query = llm_query
    builtins.llm_query_batched = llm_query_batched
    builtins.rlm_query = rlm_query
    builtins.LlmError = LlmError
    builtins.BudgetExceeded = BudgetExceeded


def on_reply(message):
    """Control thread: hand an llm_reply to the thread that waits for it, if one still does."""
    with _lock:
        slot = _waiting.get(message.get("call"))
    if slot is not None:
        slot.put(message)


def llm_query(prompt, model=None):
    """The model's answer to `prompt` (a string), from the engine's LLM; `model` is a model
    name of the engine's config, its default when None."""
    return _call("llm", [prompt], model)[0]


def llm_query_batched(prompts, model=None):
    """The model's answers to each of `prompts` (strings), in order, asked at once."""
    return _call("llm_batched", list(prompts), model)


def rlm_query(task, ctx=None, model=None):
    """The answer of a nested RLM loop, one level deeper, in a session of its own, to `task`
    (a string) with `ctx` (a string, or a value JSON can carry) as its `context` variable. The
    host may run it as a plain llm_query when the budget or depth left is too small; the
    answer then says so."""
    if ctx is not None and type(ctx) is not str:
        try:
            json.dumps(ctx)
        except (TypeError, ValueError) as err:
            raise TypeError("ctx must be a string or a value JSON can carry: %s" % err) from None
    return _call("rlm", [task], model, ctx)[0]


def _call(kind, prompts, model, context=None):
    """Send one call for the running execution and wait for its answers."""
    if not all(type(prompt) is str for prompt in prompts):
        raise TypeError("prompts must be strings")
    if model is not None and type(model) is not str:
        raise TypeError("model must be a string or None")
    execution_id = state.current_id
    if execution_id is None:
        raise LlmError("the LLM can be asked only while an execution of the session runs")
    slot = queue.SimpleQueue()
    with _lock:
        number = next(_numbers)
        _waiting[number] = slot
    try:
        frame = {"type": "llm_call", "id": execution_id, "call": number, "kind": kind,
                 "prompts": prompts, "model": model}
        if context is not None:
            frame["context"] = context
        protocol.send(frame)
        reply = slot.get()
    finally:
        with _lock:
            _waiting.pop(number, None)
    error = reply.get("error")
    if error is not None:
        message = str(error.get("message")) if isinstance(error, dict) else str(error)
        kind_name = error.get("kind") if isinstance(error, dict) else None
        raise (BudgetExceeded if kind_name == "BudgetExceeded" else LlmError)(message)
    answers = reply.get("answers")
    if (not isinstance(answers, list) or len(answers) != len(prompts)
            or not all(type(answer) is str for answer in answers)):
        raise LlmError("the host answered %d prompt(s) with something else than as many strings"
                       % len(prompts))
    return answers
