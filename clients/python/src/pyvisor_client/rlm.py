"""``PyvisorREPL``: a pyvisor session as an environment of the ``rlms`` library (the reference
implementation of recursive language models), and ``register()``, which makes
``RLM(environment="pyvisor", environment_kwargs=...)`` build it.

It takes the keyword arguments of the library's subprocess-kernel environment (``IPythonREPL``)
with the same validation, so swapping is one line, and follows its contract: ``setup``,
``load_context``, ``execute_code`` returning a ``REPLResult``, ``SupportsPersistence`` and
``SupportsCustomTools``. The model's code runs in a separate process from the daemon's pool;
its ``llm_query`` / ``rlm_query`` leave through the client-answered bridge and are answered
here, in the RLM's process (``_rlm_calls``), so the session never holds the LM handler's
address or any socket to it. Custom tools that are callables run here too, called from the
session with JSON arguments and results; data tools are copied into the session.

Beyond the reference: ``checkpoint_every_cell`` checkpoints the session after each cell, so a
crashed cell (a segfault in a C extension) comes back with all the state of the cells before
it, and ``session_name`` lets a restarted run attach to (or restore) its REPL by name.

Needs ``rlms`` installed; ``pyvisor_client`` itself does not import this module.
"""

import base64
import contextvars
import json
import pickle
import threading
import time
from pathlib import Path

from rlm.core.types import REPLResult
from rlm.environments.base_env import (
    RESERVED_TOOL_NAMES, NonIsolatedEnv, extract_tool_value, validate_custom_tools,
)

from . import _daemon
from ._rlm_calls import Answerer, Cell
from .errors import PyvisorError

_SCAFFOLD = (Path(__file__).with_name("_rlm_scaffold.py")).read_text(encoding="utf-8")

# A cell without cell_timeout: as long as the daemon's default ceiling allows (a day).
_NO_CELL_TIMEOUT_S = 86400.0
# Values longer than this (about bytes of JSON) are left out of REPLResult.locals.
LOCALS_VALUE_LIMIT = 64 * 1024
# Context and history payloads cross in pieces of at most this many characters.
_CHUNK_CHARS = 4 * 1024 * 1024


class PyvisorREPL(NonIsolatedEnv):
    """A persistent Python REPL in a pyvisor session.

    The arguments of ``IPythonREPL``: `lm_handler_address` ((host, port) of the RLM's LM
    handler), `context_payload`, `setup_code`, `persistent`, `depth`, `subcall_fn` (what
    ``rlm_query`` calls; ``llm_query`` without it), `custom_tools`, `custom_sub_tools`,
    `cell_timeout` (seconds; the session interrupts the cell, then kills and restores it),
    `startup_timeout`, `subcall_timeout` (seconds a model call may take; None: no limit),
    `max_concurrent_subcalls`. Then pyvisor's: `socket` (the daemon's socket; else
    ``$PYVISOR_SOCKET``, else the default socket, else a child ``pyvisor serve --stdio``),
    `session_name`, `checkpoint_every_cell`, `network` (whether the code may open internet
    sockets; the daemon's default when None).
    """

    def __init__(self, lm_handler_address=None, context_payload=None, setup_code=None,
                 persistent=False, depth=1, subcall_fn=None, custom_tools=None,
                 custom_sub_tools=None, cell_timeout=None, startup_timeout=60.0,
                 subcall_timeout=None, max_concurrent_subcalls=4, socket=None,
                 session_name=None, checkpoint_every_cell=False, network=None, **kwargs):
        if startup_timeout <= 0:
            raise ValueError("startup_timeout must be positive, got %r" % (startup_timeout,))
        if subcall_timeout is not None and subcall_timeout <= 0:
            raise ValueError("subcall_timeout must be positive or None (got %r); use None to "
                             "disable the timeout." % (subcall_timeout,))
        super().__init__(persistent=persistent, depth=depth,
                         max_concurrent_subcalls=max_concurrent_subcalls, **kwargs)
        self.lm_handler_address = lm_handler_address
        self.subcall_fn = subcall_fn
        self.cell_timeout = cell_timeout if cell_timeout and cell_timeout > 0 else None
        self.startup_timeout = startup_timeout
        self.subcall_timeout = subcall_timeout
        self.custom_tools = custom_tools or {}
        self.custom_sub_tools = (custom_sub_tools if custom_sub_tools is not None
                                 else self.custom_tools)
        validate_custom_tools(self.custom_tools)
        self.socket = socket
        self.session_name = session_name
        self.checkpoint_every_cell = checkpoint_every_cell
        self.network = network
        self._lock = threading.RLock()
        self._answerer = Answerer(self)
        self._connection = None
        self.session = None
        self._counts = {"context": 0, "history": 0}  # the next index of each
        try:
            self.setup()
            if context_payload is not None:
                self.load_context(context_payload)
            if setup_code:
                self.execute_code(setup_code)
        except BaseException:
            self.cleanup()
            raise

    # Setup

    def setup(self):
        """Connects to pyvisor, takes a session from its pool and installs the scaffold."""
        self._connection = _daemon.connect(self.socket, self.startup_timeout)
        self.session = self._connection.client.create_session(
            name=self.session_name, llm="client", network=self.network)
        self._install()
        if self.session.created.get("attached") or self.session.created.get("restored"):
            self._count_versions()

    def _install(self):
        data = {name: extract_tool_value(entry) for name, entry in self.custom_tools.items()
                if not callable(extract_tool_value(entry))}
        callables = sorted(set(self.custom_tools) - set(data))
        try:
            payload = base64.b64encode(pickle.dumps(data)).decode("ascii")
        except Exception as err:
            raise RuntimeError("custom tools %s could not be pickled: %s"
                               % (sorted(data), err)) from err
        # The data tools cross as an answer to input(): data, never code.
        code = ("%s\n_pyvisor_rlm_install(__import__('pickle').loads(__import__('base64')"
                ".b64decode(__import__('builtins').input())), %r, %d)"
                % (_SCAFFOLD, callables, LOCALS_VALUE_LIMIT))
        result = self.session.run(code, on_input=lambda prompt, password: payload)
        if not result.ok:
            raise RuntimeError("PyvisorREPL could not set up its session: %s"
                               % _stderr(result, None).strip())

    def _count_versions(self):
        """The context and history counts of a session that was already there."""
        result = self.session.run(
            "print(__import__('json').dumps([max([int(n[len(p):]) + 1 for n in globals()\n"
            "    if n.startswith(p) and n[len(p):].isdigit()] or [0])\n"
            "    for p in ('context_', 'history_')]))")
        self._counts["context"], self._counts["history"] = json.loads(result.stdout)

    # Context and history (SupportsPersistence)

    def load_context(self, context_payload):
        self.add_context(context_payload, 0)

    def add_context(self, context_payload, context_index=None):
        return self._add("context", context_payload, context_index)

    def get_context_count(self):
        return self._counts["context"]

    def add_history(self, message_history, history_index=None):
        return self._add("history", message_history, history_index)

    def get_history_count(self):
        return self._counts["history"]

    def _add(self, kind, payload, index):
        """Sets ``<kind>_<index>`` (the next index when None) to a copy of `payload`; the
        index."""
        with self._lock:
            if index is None:
                index = self._counts[kind]
            self._assign("%s_%d" % (kind, index), payload, kind)
            self._counts[kind] = max(self._counts[kind], index + 1)
            return index

    def update_handler_address(self, address):
        """Where the next model calls go; only this process ever holds it."""
        self.lm_handler_address = address

    def _assign(self, name, payload, what):
        """Sets `name` in the session to a copy of `payload`, which crosses as JSON text in
        answers to ``input()`` of at most _CHUNK_CHARS characters each (data, never code)."""
        text = json.dumps(payload)
        chunks = iter([text[i:i + _CHUNK_CHARS] for i in range(0, len(text), _CHUNK_CHARS)])
        count = -(-len(text) // _CHUNK_CHARS)
        code = ("%s = __import__('json').loads(''.join([__import__('builtins').input() "
                "for _ in range(%d)]))" % (name, count))
        ran, result = self._run(code, _NO_CELL_TIMEOUT_S, lambda prompt, password: next(chunks))
        if not ran.ok:
            raise RuntimeError("Failed to load %s: %s" % (what, result.stderr))

    # Execution

    def execute_code(self, code):
        """Runs `code` in the session: its REPLResult, whatever the code did."""
        return self._run(code, self.cell_timeout or _NO_CELL_TIMEOUT_S)[1]

    def _run(self, code, timeout, on_input=None):
        """Runs a cell within `timeout` seconds; `on_input` answers its ``input()`` (only
        in the adapter's own cells). The session's ExecutionResult and the REPLResult."""
        if self._answerer.answering():
            raise RuntimeError(
                "Reentrant execute_code on the same instance from inside subcall_fn or a "
                "custom tool is not supported: the running cell waits for that call. "
                "subcall_fn must spawn a child REPL instead of calling back into its parent.")
        if self.session is None:
            raise RuntimeError("PyvisorREPL is cleaned up")
        with self._lock:
            start = time.perf_counter()
            cell = Cell()
            result = self.session.run(code, timeout=timeout, on_llm=self._answerer.on_llm(cell),
                                      on_input=on_input)
            final, values = self._after()
            stderr = _stderr(result, self.cell_timeout)
            if self.checkpoint_every_cell:
                stderr += self._checkpoint()
            return result, REPLResult(stdout=_stdout(result), stderr=stderr, locals=values,
                                      execution_time=time.perf_counter() - start,
                                      rlm_calls=cell.close(), final_answer=final)

    def wait_for_calls(self, timeout):
        """Waits up to `timeout` seconds until no model call or custom tool of this REPL's
        cells is being answered (one whose cell timed out may run on); whether none is."""
        return self._answerer.wait_idle(timeout)

    def _after(self):
        """Restores the scaffold after a cell: (final answer, simple values). A namespace
        that lost the scaffold (a crash before any checkpoint held it, or code that deleted
        it) gets it again."""
        result = self.session.run("_pyvisor_rlm_after()")
        if not result.ok:
            self._install()
            result = self.session.run("_pyvisor_rlm_after()")
        for line in reversed(result.stdout.splitlines()):
            if line.startswith('{"final"'):
                after = json.loads(line)
                return after["final"], {name: json.loads(text)
                                        for name, text in after["locals"].items()}
        raise RuntimeError("PyvisorREPL lost its scaffold: %s" % _stderr(result, None))

    def _checkpoint(self):
        """Checkpoints the session; what stderr says when that failed."""
        try:
            saved = self.session.checkpoint()
        except PyvisorError as err:
            return "\n[pyvisor] checkpoint failed: %s" % err
        # The scaffold's functions are not saved: they are installed again after a crash.
        ours = RESERVED_TOOL_NAMES | {"input"} | set(self.custom_tools)
        lost = [item["name"] for item in saved.get("lost", [])
                if not item["name"].startswith("_") and item["name"] not in ours]
        return "\n[pyvisor] not checkpointed: %s" % ", ".join(lost) if lost else ""

    # Lifecycle

    def cleanup(self):
        """Closes the session and the connection (and the child daemon if one was started);
        a second call does nothing."""
        session, self.session = getattr(self, "session", None), None
        connection, self._connection = getattr(self, "_connection", None), None
        if session is not None:
            try:
                session.close()
            except (PyvisorError, OSError):
                pass  # the daemon is gone already: nothing is left to close
        if connection is not None:
            connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False

    def __del__(self):
        try:
            self.cleanup()
        except Exception:
            pass


def _stdout(result):
    """What the cell printed, then its final expression's value and text displays, as an
    IPython kernel shows them."""
    parts = [result.stdout]
    if result.value is not None:
        parts.append(result.value + "\n")
    parts += [item.data + "\n" for item in result.display if item.mime == "text/plain"]
    return "".join(parts)


def _stderr(result, cell_timeout):
    """What the cell wrote to stderr, then why it failed, in the reference's words."""
    error = result.error or {}
    if result.status == "timeout":
        limit = cell_timeout if cell_timeout is not None else _NO_CELL_TIMEOUT_S
        return result.stderr + ("\nTimeoutError: cell execution exceeded %ss and was "
                                "interrupted" % limit) + _recovered(result.recovered)
    if result.status == "crashed":
        return result.stderr + "\n%s: %s" % (error.get("type"), error.get("message"))
    if result.status != "ok":
        trace = "".join(error.get("traceback") or []) + _recovered(result.recovered)
        return result.stderr + "\n" + (trace or "%s: %s" % (error.get("type"),
                                                            error.get("message")))
    return result.stderr


def _recovered(recovered):
    """What the session came back from, when its worker was killed (the cell ignored the
    interrupt)."""
    if not recovered:
        return ""
    if recovered.get("fresh_namespace"):
        return "\n[pyvisor] the cell was killed; the REPL restarted with an empty namespace"
    return ("\n[pyvisor] the cell was killed; the REPL came back from checkpoint %s (%s cell(s) "
            "since then lost)" % (recovered.get("checkpoint_id"),
                                  recovered.get("lost_executions")))


# register(): the library as published knows seven environments by name.

_current_rlm = contextvars.ContextVar("pyvisor_rlm_current", default=None)
_registered = False


def register():
    """Makes ``RLM(environment="pyvisor", environment_kwargs=...)`` build a PyvisorREPL.

    The library picks environments in ``rlm.environments.get_environment``, which
    ``rlm.core.rlm`` imported by name, and knows which take ``subcall_fn`` and persistence
    by a list of names; register() wraps those three places (once; calling it again does
    nothing) until the library knows the environment by itself. Other environments are
    built as before.
    """
    global _registered
    if _registered:
        return
    import rlm.core.rlm as core
    import rlm.environments as environments

    original_get = environments.get_environment

    def get_environment(environment, environment_kwargs):
        if environment != "pyvisor":
            return original_get(environment, environment_kwargs)
        kwargs = dict(environment_kwargs)
        owner = _current_rlm.get()
        # The library hands subcall_fn only to the environments it names.
        if owner is not None and owner.max_depth > 1 and "subcall_fn" not in kwargs:
            kwargs["subcall_fn"] = owner._subcall
        return PyvisorREPL(**kwargs)

    original_spawn = core.RLM._spawn_completion_context

    def spawn_completion_context(self, prompt):
        return _Spawning(self, original_spawn(self, prompt))

    original_validate = core.RLM._validate_persistent_environment_support

    def validate_persistent_environment_support(self):
        if self.environment_type != "pyvisor":
            original_validate(self)

    environments.get_environment = get_environment
    core.get_environment = get_environment
    core.RLM._spawn_completion_context = spawn_completion_context
    core.RLM._validate_persistent_environment_support = validate_persistent_environment_support
    _registered = True


class _Spawning:
    """The RLM's completion context, entered with that RLM known to get_environment."""

    def __init__(self, owner, inner):
        self._owner = owner
        self._inner = inner

    def __enter__(self):
        token = _current_rlm.set(self._owner)
        try:
            return self._inner.__enter__()
        finally:
            _current_rlm.reset(token)

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)
