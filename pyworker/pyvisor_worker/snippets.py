"""One snippet of a speculation, run in the forked child (see speculation), and its outcome.

The outcome: {"status", "stdout", "stderr", "result", "display", "error", "servable",
"refusal", "reads", "files", "ambient", "binds", "cpu_ms", "duration_ms"}, its "result" and
"error" as a result message has them. A snippet runs when the purity guard finds it pure, or
when its only impurity is plain assignments of pure expressions to names (a "binding" snippet,
``y = x * 2``: run so that later snippets see y, never servable). Any other snippet is not
run: its outcome has status "error", no result and no error, and the guard's reason as
"refusal". A run snippet has its reads stamped before it runs ({"name", "fingerprint"}, null
for a name not bound; see fingerprints), the files it opened and the ambient token (see
surroundings), and is servable unless the first of these refusals applies:

- "binds names": a binding snippet ("binds" lists the names it added or rebound);
- "asks for input": it called input() or getpass();
- "raised an error": any error, the snippet's own or a MemoryError;
- "changed the namespace": a name was added, removed or rebound;
- "changed <name>": the value of a name it read no longer has the same fingerprint;
- "wrote to stderr": warnings among others (a real run would also record the warning);
- "plots": it left a pyplot figure open (a real run would send it as a display);
- "output is not UTF-8", "output over the limit": stdout and stderr together must be whole
  UTF-8 of at most output_limit bytes. stdout and stderr are decoded with replacement and cut
  to output_limit bytes in any outcome.
"""

import ast
import os
import resource
import sys
import time

from pyvisor_worker import (cells, execution, fingerprints, hidden, protocol, purity, state,
                            surroundings)


class AskedForInput(BaseException):
    """Raised by input() and getpass() in a speculative run: nobody can answer them."""


_asked = False  # the running snippet called input() or getpass()
_kept_guard = None  # the last snippet's guard, while the child stays faithful (see hidden)


def refuse_input(prompt="", stream=None):
    """input() and getpass.getpass() in the child: mark the snippet refused and stop it."""
    global _asked
    _asked = True
    raise AskedForInput("a speculative run cannot ask for input")


def run(code, filename, repr_limit, output_limit, displays):
    """Run `code` in the child as the cell `filename`: (its outcome, whether the child is still
    a faithful copy of the session for the snippets after it: see hidden; a snippet that
    changed what it read, wrote to stderr (a warning is shown once) or left a figure open also
    leaves it unfaithful). `displays` is the list that display() fills while it runs."""
    global _asked, _kept_guard
    namespace = state.namespace
    outcome = {"status": "error", "stdout": "", "stderr": "", "result": None, "display": [],
               "error": None, "servable": False, "refusal": None, "reads": [], "files": [],
               "ambient": "", "binds": [], "cpu_ms": 0.0, "duration_ms": 0.0}
    cell = cells.Cell(code, filename)
    try:
        tree = cell.tree
    except (SyntaxError, ValueError):
        return dict(outcome, refusal="does not parse"), True
    refusal = purity.check(code, namespace, tree)
    if refusal is not None and purity.binding_names(tree, namespace) is None:
        return dict(outcome, refusal=refusal), True
    binding = refusal is not None
    reads = sorted({node.id for node in ast.walk(tree)
                    if type(node) is ast.Name and type(node.ctx) is ast.Load})
    stamps = [_stamp(name) for name in reads]
    guard = _guard([namespace[name] for name in reads if name in namespace])
    names, values = list(namespace), list(namespace.values())
    ambient = surroundings.ambient()
    for fd in (1, 2):
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
    _asked = False
    used, started = _cpu_seconds(), time.perf_counter()
    with surroundings.recording() as files:
        try:
            value, error = execution.run_cell(cell, repr_limit), None
        except BaseException as exc:
            value, error = None, execution.describe_error(exc, repr_limit)
    protocol.flush_output()
    duration, cpu = time.perf_counter() - started, _cpu_seconds() - used
    faithful = guard.restore()
    stdout, stderr = _output(1), _output(2)
    outcome.update(
        status="ok" if error is None else "error", result=value, error=error,
        display=list(displays), reads=stamps, files=surroundings.stamps(files.paths),
        ambient=ambient, binds=_rebound(names, values), cpu_ms=cpu * 1000,
        duration_ms=duration * 1000,
        stdout=_text(stdout, output_limit), stderr=_text(stderr, output_limit),
    )
    changed = _changed_read(stamp for stamp in stamps if stamp["name"] not in outcome["binds"])
    lasting = _lasting_output(stderr)
    faithful = faithful and changed is None and lasting is None
    if binding:
        refusal = "binds names"
    elif _asked:
        refusal = "asks for input"
    elif error is not None:
        refusal = "raised an error"
    elif outcome["binds"] or list(namespace) != names:
        refusal, faithful = "changed the namespace", False
    else:
        refusal = changed or lasting or _output_refusal(stdout, stderr, output_limit)
    outcome.update(servable=refusal is None, refusal=refusal)
    _kept_guard = guard if faithful else None
    return outcome, faithful


def _guard(values):
    """The guard of the objects `values`: the last snippet's when it read the same ones (it
    left them as that guard noted them), else a new one."""
    if _kept_guard is not None and _kept_guard.watches(values):
        return _kept_guard
    return hidden.Guard(values)


def _stamp(name):
    value = state.namespace.get(name, state.MISSING)
    fingerprint = None if value is state.MISSING else fingerprints.content_fingerprint(value)
    return {"name": name, "fingerprint": fingerprint}


def _rebound(names, values):
    """The names added, rebound or removed since the namespace had `names` bound to `values`."""
    namespace, before = state.namespace, dict(zip(names, values))
    changed = [name for name, value in namespace.items()
               if before.get(name, state.MISSING) is not value]
    changed += [name for name in names if name not in namespace]
    return sorted(name for name in changed if state.is_user_name(name))


def _changed_read(stamps):
    for stamp in stamps:
        if _stamp(stamp["name"]) != stamp:
            return "changed " + stamp["name"]
    return None


def _lasting_output(stderr):
    """The refusal for output whose making leaves something behind in the process."""
    if stderr:
        return "wrote to stderr"
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and pyplot.get_fignums():
        return "plots"
    return None


def _output_refusal(stdout, stderr, output_limit):
    try:
        stdout.decode("utf-8")
    except UnicodeDecodeError:
        return "output is not UTF-8"
    if len(stdout) + len(stderr) > output_limit:
        return "output over the limit"
    return None


def _output(fd):
    """What the snippet wrote to fd 1 or 2 (a memfd)."""
    size = os.fstat(fd).st_size
    return os.pread(fd, size, 0) if size else b""


def _text(data, limit):
    return data[:limit].decode("utf-8", "replace")


def _cpu_seconds():
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime
