"""How a PyvisorREPL answers the model calls of its session's code, in the RLM's own process:
the ``bridge.llm`` requests of the client-answered bridge become requests to the RLM's LM
handler at ``lm_handler_address`` (``llm_query``, ``llm_query_batched``), calls of
``subcall_fn`` (``rlm_query``, ``rlm_query_batched``; ``llm_query`` when there is none), and
calls of the custom tools that are callables. Failures answer with the reference's
``"Error: ..."`` strings, as its environments do.

Each cell gets a Cell that collects the completions its calls return; a call that completes
after its cell ended (the cell timed out, or was interrupted) is dropped, never counted in a
later cell.
"""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

from rlm.core.comms_utils import LMRequest, send_lm_request, send_lm_request_batched
from rlm.environments.base_env import extract_tool_value


class Cell:
    """The completions of one cell's calls, until the cell ends."""

    def __init__(self):
        self._lock = threading.Lock()
        self._calls = []
        self._open = True

    def record(self, *completions):
        with self._lock:
            if self._open:
                self._calls.extend(completions)

    def close(self):
        """Ends the cell; its completions, in the order they came."""
        with self._lock:
            self._open = False
            return list(self._calls)


class Answerer:
    """Answers the bridge calls of one environment. `env` is the PyvisorREPL: its
    ``lm_handler_address`` (which may change between completions), ``depth``,
    ``subcall_fn``, ``subcall_timeout`` and ``custom_tools``."""

    def __init__(self, env):
        self._env = env
        # Bounds the subcall_fn calls in flight across the environment, from all cells.
        self._subcalls = threading.BoundedSemaphore(max(1, env.max_concurrent_subcalls))
        self._lock = threading.Lock()
        self._threads = set()  # the threads answering a call now
        self._idle = threading.Condition(self._lock)

    def on_llm(self, cell):
        """The ``on_llm`` of one cell's run."""
        def answer(call):
            me = threading.get_ident()
            with self._lock:
                self._threads.add(me)
            try:
                return self._answer(cell, call)
            finally:
                with self._lock:
                    self._threads.discard(me)
                    self._idle.notify_all()
        return answer

    def answering(self):
        """Whether the calling thread is answering a call (so it must not run a cell of
        this environment: that cell would wait for the one that waits for it)."""
        with self._lock:
            return threading.get_ident() in self._threads

    def wait_idle(self, timeout):
        """Waits up to `timeout` seconds until no call is being answered; whether none is."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._threads, timeout)

    def _answer(self, cell, call):
        kind, prompts, model = call.get("kind"), call.get("prompts") or [""], call.get("model")
        if kind == "llm":
            return self._llm(cell, prompts[0], model)
        if kind == "llm_batched":
            return self._llm_batched(cell, prompts, model)
        request = call.get("context")
        if not isinstance(request, dict) or "pyvisor_rlm" not in request:
            return self._rlm(cell, prompts[0], model)
        what = request["pyvisor_rlm"]
        if what == "llm":
            return json.dumps(self._llm(cell, request.get("prompt"), model))
        if what == "llm_batched":
            return json.dumps(self._llm_batched(cell, request.get("prompts") or [], model))
        if what == "rlm_batched":
            return json.dumps(self._rlm_batched(cell, request.get("prompts") or [], model))
        if what == "tool":
            return json.dumps(self._tool(request))
        return json.dumps("Error: unknown request %r" % (what,))

    def _llm(self, cell, prompt, model):
        address = self._env.lm_handler_address
        if not address:
            return "Error: No LM handler configured"
        response = send_lm_request(tuple(address),
                                   LMRequest(prompt=prompt, model=model, depth=self._env.depth),
                                   timeout=self._env.subcall_timeout)
        if not response.success:
            return "Error: %s" % response.error
        cell.record(response.chat_completion)
        return response.chat_completion.response

    def _llm_batched(self, cell, prompts, model):
        address = self._env.lm_handler_address
        if not address:
            return ["Error: No LM handler configured"] * len(prompts)
        responses = send_lm_request_batched(tuple(address), prompts, model=model,
                                            timeout=self._env.subcall_timeout,
                                            depth=self._env.depth)
        cell.record(*(r.chat_completion for r in responses if r.success))
        return [r.chat_completion.response if r.success else "Error: %s" % r.error
                for r in responses]

    def _rlm(self, cell, prompt, model):
        """One ``rlm_query``: ``subcall_fn`` (at most max_concurrent_subcalls at once), else a
        plain ``llm_query``."""
        subcall_fn = self._env.subcall_fn
        if subcall_fn is None:
            return self._llm(cell, prompt, model)
        try:
            with self._subcalls:
                completion = self._within_timeout(subcall_fn, prompt, model)
        except Exception as err:  # the model's code gets the reason as text
            return "Error: RLM query failed - %s" % err
        cell.record(completion)
        return completion.response

    def _rlm_batched(self, cell, prompts, model):
        if self._env.subcall_fn is None:
            return self._llm_batched(cell, prompts, model)
        if not prompts:
            return []
        workers = max(1, min(self._env.max_concurrent_subcalls, len(prompts)))
        # Each prompt's completion is recorded in prompt order, as the reference does.
        batch = [Cell() for _ in prompts]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            answers = list(pool.map(lambda i: self._rlm(batch[i], prompts[i], model),
                                    range(len(prompts))))
        for one in batch:
            cell.record(*one.close())
        return answers

    def _within_timeout(self, fn, *args):
        """``fn(*args)``, given up after ``subcall_timeout`` seconds (TimeoutError) when set;
        the call itself runs on to its end, as a thread cannot be stopped."""
        timeout = self._env.subcall_timeout
        if timeout is None:
            return fn(*args)
        outcome = {}

        def run():
            with self._lock:
                self._threads.add(threading.get_ident())
            try:
                outcome["value"] = fn(*args)
            except Exception as err:
                outcome["error"] = err
            finally:
                with self._lock:
                    self._threads.discard(threading.get_ident())
                    self._idle.notify_all()

        worker = threading.Thread(target=run, name="pyvisor-rlm-subcall", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise TimeoutError("no answer within subcall_timeout (%ss)" % timeout)
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _tool(self, request):
        """Calls a custom tool that is a callable: {"value": result} or {"error": reason}."""
        name = request.get("name")
        tool = self._env.custom_tools.get(name) if isinstance(name, str) else None
        tool = extract_tool_value(tool) if tool is not None else None
        if not callable(tool):
            return {"error": "no custom tool %r" % (name,)}
        args, kwargs = request.get("args") or [], request.get("kwargs") or {}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return {"error": "bad arguments"}
        try:
            value = tool(*args, **kwargs)
        except Exception as err:  # raised in the model's code as RuntimeError
            return {"error": "%s: %s" % (type(err).__name__, err)}
        try:
            json.dumps(value)
        except (TypeError, ValueError) as err:
            return {"error": "its result is not JSON: %s" % err}
        return {"value": value}
