"""What a PyvisorREPL puts in its session: this file's text is run as code in the session (it
is never imported by the client). It gives the model's code the names of the rlms REPL
contract (``llm_query``, ``llm_query_batched``, ``rlm_query``, ``rlm_query_batched``,
``SHOW_VARS``, ``answer``, a disabled ``input``) and ``_pyvisor_rlm_after``, which the adapter
runs after each cell: it restores those names and the ``context`` / ``history`` aliases,
re-binds the custom data tools, and prints one JSON line with the cell's final answer and the
namespace's simple values.

Every model call leaves through the session's client-answered bridge (the ``llm_query`` /
``rlm_query`` builtins of a session created with ``llm="client"``): the session holds no
address, socket or key. Calls the bridge has no kind for (``rlm_query_batched``, custom tool
calls, prompts that are not strings, such as lists of messages) are ``rlm_query`` calls whose
``ctx`` says what they are; the adapter answers them as JSON text.
"""

import builtins as _pyvisor_builtins


def _pyvisor_rlm_install(tools, callables, value_limit):
    """Installs the scaffold in this namespace: `tools` are the data tools' values,
    `callables` the names of the custom tools that run in the RLM's process."""
    import json

    namespace = globals()
    bridge = {name: getattr(_pyvisor_builtins, name)
              for name in ("llm_query", "llm_query_batched", "rlm_query", "LlmError")}
    failed = bridge["LlmError"]
    state = {"final": None, "tools": dict(tools), "callables": list(callables)}

    def control(what, model=None, **request):
        """Asks the adapter for something the bridge has no kind for; its JSON answer."""
        request["pyvisor_rlm"] = what
        return json.loads(bridge["rlm_query"](what, request, model))

    def llm_query(prompt, model=None):
        try:
            if type(prompt) is str:
                return bridge["llm_query"](prompt, model)
            return control("llm", model, prompt=prompt)  # a list of messages, say
        except failed as err:
            return "Error: %s" % err

    def llm_query_batched(prompts, model=None):
        prompts = list(prompts)
        try:
            if all(type(prompt) is str for prompt in prompts):
                return bridge["llm_query_batched"](prompts, model)
            return control("llm_batched", model, prompts=prompts)
        except failed as err:
            return ["Error: %s" % err] * len(prompts)

    def rlm_query(prompt, model=None):
        try:
            return bridge["rlm_query"](prompt, None, model)
        except failed as err:
            return "Error: %s" % err

    def rlm_query_batched(prompts, model=None):
        prompts = list(prompts)
        try:
            return control("rlm_batched", model, prompts=prompts)
        except failed as err:
            return ["Error: %s" % err] * len(prompts)

    def tool(name):
        def call(*args, **kwargs):
            try:
                answer = control("tool", name=name, args=list(args), kwargs=kwargs)
            except failed as err:
                raise RuntimeError("custom tool %s failed: %s" % (name, err)) from None
            if "error" in answer:
                raise RuntimeError("custom tool %s failed: %s" % (name, answer["error"]))
            return answer["value"]
        call.__name__ = call.__qualname__ = name
        return call

    def capture(content):
        state["final"] = str(content)

    class AnswerDict(dict):
        """``answer["ready"] = True`` hands ``answer["content"]`` to the adapter."""

        def __init__(self):
            super().__init__(content="", ready=False)

        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            if key == "ready" and value:
                capture(self.get("content", ""))

    def disabled_input(*args, **kwargs):
        raise RuntimeError("input() is disabled in PyvisorREPL: cells cannot prompt for stdin")

    scaffold = {"llm_query": llm_query, "llm_query_batched": llm_query_batched,
                "rlm_query": rlm_query, "rlm_query_batched": rlm_query_batched,
                "input": disabled_input}
    scaffold.update((name, tool(name)) for name in callables)

    def hidden(name):
        return name.startswith("_") or name in scaffold or name == "SHOW_VARS"

    def show_vars():
        available = {name: type(value).__name__ for name, value in namespace.items()
                     if not hidden(name) and name != "answer"}
        if not available:
            return "No variables created yet. Use ```repl``` blocks to create variables."
        return "Available variables: %s" % available

    def left(value, budget):
        """What is left of `budget` (about bytes of JSON) after `value`, a simple value
        (None, bool, int, float, str, and lists, tuples and str-keyed dicts of them); -1
        when it is not one or does not fit."""
        if budget < 0:
            return -1
        if value is None or type(value) in (bool, int, float):
            return budget - 8
        if type(value) is str:
            return budget - len(value) - 2
        if type(value) in (list, tuple):
            for item in value:
                budget = left(item, budget - 1)
                if budget < 0:
                    break
            return budget
        if type(value) in (dict, AnswerDict):
            for key, item in value.items():
                budget = left(item, budget - len(key) - 4) if type(key) is str else -1
                if budget < 0:
                    break
            return budget
        return -1

    def restore():
        namespace.update(scaffold)
        namespace["SHOW_VARS"] = show_vars
        current = namespace.get("answer")
        if not isinstance(current, AnswerDict):
            replacement = AnswerDict()
            if isinstance(current, dict):
                dict.update(replacement, current)
                if current.get("ready") and state["final"] is None:
                    capture(current.get("content", ""))
            namespace["answer"] = replacement
        for alias in ("context", "history"):
            if alias + "_0" in namespace:
                namespace[alias] = namespace[alias + "_0"]
        namespace.update(state["tools"])

    def after():
        """Restores the scaffold; prints {final, locals} as one JSON line."""
        restore()
        final, state["final"] = state["final"], None
        values = {}
        for name, value in list(namespace.items()):
            if hidden(name) or name in state["callables"]:
                continue
            try:
                if left(value, value_limit) >= 0:
                    values[name] = json.dumps(value)
            except RecursionError:
                continue  # a list that holds itself
        print(json.dumps({"final": final, "locals": values}))

    restore()
    namespace["_pyvisor_rlm_after"] = after
