"""Cell facts: what one execution read, bound and touched, for the proactive engine.

Computed only for an execute request with "facts": true, and sent in its result as "facts":

- "reads": the names the code loads (every Name in a load context, at any depth), sorted;
- "binds": the names the execution added, rebound (to another object) or removed, sorted;
- "touched": the names whose values it could have changed in place: for code that cannot
  mutate (see changes), or whose every statement is an expression or an assignment to plain
  names of a value the purity guard passes (``small = df[df.a > 1]``), its binds, else every
  name it can reach (see changes) but modules (a
  change to a module's options shows in the ambient) and its binds, with their aliases: the
  other names bound to one of their objects, or to a numpy array over the same memory (the
  same root ``.base``); null when that cannot be told;
- "files": the files it opened for reading, stamped after the run (see surroundings);
- "ambient": the ambient token after the run (see surroundings);
- "objects": summaries of the data among the values of binds and touched (see summaries), at
  most MAX_OBJECTS;
- "pure": whether the purity guard finds the code pure, against the namespace it ran in;
- "cost_ms": the time the worker spent on all this, the run itself left out.
"""

import ast
import contextlib
import sys
import time
import types

from pyvisor_worker import purity, state, summaries, surroundings

MAX_OBJECTS = 20

# Values that two names can share without one changing through the other.
_IMMUTABLE = (
    type(None), bool, int, float, complex, str, bytes, range, type, types.ModuleType,
    types.FunctionType, types.BuiltinFunctionType,
)

NOT_RECORDING = contextlib.nullcontext()


class Recorder:
    """The facts of one execution: created before it runs, asked for them after."""

    __slots__ = ("cell", "before", "files", "cost")

    def __init__(self, cell):
        started = time.perf_counter()
        self.cell = cell
        self.before = dict(state.namespace)
        self.files = surroundings.recording()  # the context the code runs in
        self.cost = time.perf_counter() - started

    def facts(self, watch):
        """The "facts" of the execution, once it has run and `watch` has seen it."""
        started = time.perf_counter()
        namespace, before = state.namespace, self.before
        binds = [name for name, value in namespace.items()
                 if state.is_user_name(name) and before.get(name, state.MISSING) is not value]
        removed = [name for name in before if name not in namespace and state.is_user_name(name)]
        summaries.forget(removed)
        binds = sorted(binds + removed)
        try:
            tree = self.cell.tree
        except (SyntaxError, ValueError):
            tree = None
        pure = tree is not None and purity.check(self.cell.code, before, tree) is None
        touched = binds
        # A pure expression that bound nothing passes _binds_only by the same check.
        if watch.may_mutate and not (pure and not binds) and not (
                tree is not None and _binds_only(tree, before, binds)):
            reachable = watch.touched()
            touched = None if reachable is None else _with_aliases(reachable, binds)
        reads = sorted({node.id for node in ast.walk(tree)
                        if type(node) is ast.Name and type(node.ctx) is ast.Load}) if tree else []
        facts = {
            "reads": reads,
            "binds": binds,
            "touched": touched,
            "files": surroundings.stamps(self.files.paths),
            "ambient": surroundings.ambient(),
            "objects": _objects(binds if touched is None else touched),
            "pure": pure,
        }
        facts["cost_ms"] = (self.cost + time.perf_counter() - started) * 1000
        return facts


def _binds_only(tree, before, binds):
    """Whether every statement of `tree` is an expression or an assignment to plain names
    (or a tuple of them) of a value the purity guard passes: such a cell changes no object
    in place. A name the cell bound is judged by the value it holds after the cell."""
    namespace = dict(before)
    for name in binds:
        if name in state.namespace:
            namespace[name] = state.namespace[name]
        else:
            namespace.pop(name, None)
    for statement in tree.body:
        if type(statement) is ast.Assign:
            if not all(_plain_target(target) for target in statement.targets):
                return False
        elif type(statement) is not ast.Expr:
            return False
        if purity.check_node(statement.value, namespace) is not None:
            return False
    return True


def _plain_target(target):
    if type(target) is ast.Name:
        return True
    return type(target) in (ast.Tuple, ast.List) and all(type(item) is ast.Name
                                                         for item in target.elts)


def _with_aliases(reachable, binds):
    """`reachable` names that are bound, `binds`, and the names sharing their objects, sorted."""
    namespace = state.namespace
    names = {name for name in reachable if state.is_user_name(name)
             and not isinstance(namespace.get(name), (types.ModuleType, type(None)))}
    names.update(binds)
    shared = set()
    for name in names:
        value = namespace.get(name, state.MISSING)
        if value is not state.MISSING and not isinstance(value, _IMMUTABLE):
            shared.add(id(value))
            shared.add(id(_root(value)))
    for name, value in namespace.items():
        if name not in names and state.is_user_name(name) and not isinstance(value, _IMMUTABLE):
            if id(value) in shared or id(_root(value)) in shared:
                names.add(name)
    return sorted(names)


def _root(value):
    """The numpy array that owns the memory of `value`, an array; else `value` itself."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not isinstance(value, numpy.ndarray):
        return value
    while isinstance(value.base, numpy.ndarray):
        value = value.base
    return value


def _objects(names):
    """Summaries of the data bound to `names`, at most MAX_OBJECTS."""
    found, namespace = [], state.namespace
    for name in names:
        value = namespace.get(name, state.MISSING)
        if value is state.MISSING:
            continue
        try:
            described = summaries.summary(name, value)
        except Exception:  # the value's own code may raise
            described = None
        if described is not None:
            found.append(described)
            if len(found) == MAX_OBJECTS:
                break
    return found
