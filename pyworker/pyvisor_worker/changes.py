"""What a cell does to the namespace: "changed", transactions, and the definitions it makes.

"changed" says whether the execution may have changed the namespace, for the host to debounce
its automatic checkpoints: true when a name was added, removed or rebound, or when the code
contains a call, an assignment (=, +=, :=, annotated), del, import, def, class, global,
nonlocal, await, or a with, for or while statement, any of which could change an object in
place; false for a pure expression such as ``x``, ``1 + 2`` or ``x.shape``. It can be true for
code that changed nothing (a keyword in a string, say), never false for code that did, short
of a property or __getattr__ with side effects.

Transactions: with "rollback_on_failure", an execution that fails (any error, SystemExit and
KeyboardInterrupt included) leaves the namespace as it was, and its result says "rolled_back":
true. Before the code runs, the worker keeps a shallow copy of the namespace dict and, for each
name the code can reach, a copy of its value: copy.deepcopy(), or a pickle when that fails. The
names the code can reach are every Name of its AST at any depth, plus, transitively, the global
names that the session's functions and classes among them use (the co_names of their code and
of the code nested in it). When the code fails, the names it created are removed, those it
deleted or rebound are bound to their old objects again, and the reachable names get their
copies, which undoes in-place mutations (``lst.append(1); raise ValueError`` leaves lst as it
was). When it succeeds the copies are dropped. The cost is a copy of the data the code can
reach, not of the namespace: for a cell that touches a 100 MB array, 40 to 90 ms and 100 MB
more memory while it runs (as much as copying the array); for one that does not, some µs.
Not undone: a value that can be neither deep-copied nor pickled (a socket, a generator) stays
as the code left it, and the error is reported as it was; objects that referred to a
rolled-back value still see the original, which the code may have mutated; values reached only
through strings (``globals()["x"]``); changes outside the namespace (files, sys.modules, the
state of imported modules, closures and default values of functions).

Definitions: the functions, classes and lambdas that a cell defines at its top level (``def``,
``async def`` and ``class`` statements with their decorators, ``name = lambda ...``
assignments) are kept in state.definitions with their source, for checkpoints and inspect.
"""

import ast
import operator
import re
import types

from pyvisor_worker import cells, state, versions

# The nodes of code that could change an object in place or a binding.
_MUTATING_NODES = frozenset((
    ast.Call, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.NamedExpr, ast.Delete, ast.Import,
    ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Global,
    ast.Nonlocal, ast.Await, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While,
))

# Text without which code has none of those nodes: a call, an "=" that is not part of a
# comparison, or a keyword. It spares most cells a parse to tell whether they could mutate.
_MUTATION_HINT = re.compile(
    r"[\w)\]]\s*\(|(?<![=!<>])=(?!=)|<<=|>>="
    r"|\b(?:import|del|def|class|global|nonlocal|await|with|for|while)\b"
)

# A Python identifier, as far as the names of a namespace go.
_IDENTIFIER = re.compile(r"[^\W\d]\w*")

# Text without which code defines no function, class or lambda.
_DEFINES = re.compile(r"\b(?:def|class|lambda)\b")

# Values that a rollback does not need to copy: immutable, or restored by rebinding the name.
_NOT_COPIED = (
    type(None), bool, int, float, complex, str, bytes, range, type, types.ModuleType,
    types.FunctionType, types.BuiltinFunctionType,
)


class Watch:
    """What one execution does to the namespace: whether it changes it, which definitions it
    makes, and with a rollback_on_failure transaction how to undo it (see the docstring)."""

    __slots__ = (
        "cell", "rollback", "started", "may_mutate", "bindings", "candidates", "before", "copies",
        "pickles", "uncopied",
    )

    def __init__(self, cell, rollback):
        self.cell = cell
        self.rollback = rollback
        self.started = False  # before_run() is done, the code itself runs
        self.may_mutate = True  # the code could mutate an object or rebind a name
        self.bindings = None  # the names and values before the code ran, if may_mutate is False
        self.candidates = {}  # the cell's definitions: name -> (kind, source, value before)
        self.before = None  # rollback: the namespace dict before the code ran
        self.copies = {}  # rollback: name -> copy of its value before the code ran
        self.pickles = {}  # rollback: name -> pickle of it, when deepcopy() failed
        self.uncopied = False  # rollback: some reachable value could be neither

    def before_run(self):
        """Keep what after_run() needs; this runs as part of the execution."""
        cell, namespace = self.cell, state.namespace
        defines = _DEFINES.search(cell.code) is not None
        if self.rollback or defines or cells.may_end_with_expression(cell.code):
            cell.tree  # parsed now, and execution compiles the tree: parsed once
        if _MUTATION_HINT.search(cell.code) is None:
            self.may_mutate = False
        elif cell.parsed:
            self.may_mutate = _has_mutating_node(cell.tree)
        if not self.may_mutate:
            # Held for the run of code that deletes nothing, compared by identity after it.
            self.bindings = list(namespace), list(namespace.values())
        if defines:
            self.candidates = {
                name: (kind, source, namespace.get(name, state.MISSING))
                for name, (kind, source) in _definitions_in(cell).items()
            }
        if self.rollback:
            self.before = dict(namespace)
            self._copy_reachable()
        self.started = True

    def after_run(self, error):
        """(changed, rolled_back) once the code has run, and failed with `error` unless None."""
        if self.rollback and error is not None:
            if self.started:  # else the code did not run, and changed nothing
                self._roll_back()
                # The reachable names hold copies now: new objects for the next checkpoint.
                versions.touch(_reachable_names(self.cell.tree))
            return self.uncopied and self.may_mutate, True
        if not self.started:  # it did not parse: nothing ran
            return False, False
        namespace, definitions = state.namespace, state.definitions
        for name, (kind, source, old) in self.candidates.items():
            value = namespace.get(name, state.MISSING)
            if value is not state.MISSING and value is not old:  # this cell bound it
                definitions.pop(name, None)
                definitions[name] = (kind, source, value)
        changed = self.may_mutate or _rebound(*self.bindings)
        if changed:
            versions.touch(self.touched())
        if changed and definitions:
            for name, (_, _, value) in list(definitions.items()):
                if namespace.get(name, state.MISSING) is not value:
                    del definitions[name]
        return changed, False

    def touched(self):
        """The names whose values the code could have changed; None when it cannot be told.

        From the AST when the cell was parsed anyway; else from every identifier in its
        text, a superset that spares a parse on the path of every execution."""
        if not self.cell.parsed:
            return _reachable_from(set(_IDENTIFIER.findall(self.cell.code)))
        try:
            return _reachable_names(self.cell.tree)
        except Exception:  # the source does not parse: it ran through another path
            return None

    def _copy_reachable(self):
        """Copy the value of every name the cell can reach, as it is before the cell runs."""
        import copy

        memo = {}  # one memo for all: names that share an object share its copy
        for name in _reachable_names(self.cell.tree):
            value = self.before.get(name, state.MISSING)
            if value is state.MISSING or isinstance(value, _NOT_COPIED):
                continue
            try:
                if type(value) is bytearray:  # deepcopy() would go through bytes: 4 times slower
                    self.copies[name] = memo.setdefault(id(value), bytearray(value))
                else:
                    self.copies[name] = copy.deepcopy(value, memo)
            except Exception:
                try:
                    import pickle

                    self.pickles[name] = pickle.dumps(value, protocol=5)
                except Exception:
                    self.uncopied = True

    def _roll_back(self):
        """Put the namespace back as it was before the cell ran."""
        namespace, before = state.namespace, self.before
        for name in [name for name in namespace if name not in before]:
            del namespace[name]
        for name, value in before.items():
            if namespace.get(name, state.MISSING) is not value:
                namespace[name] = value
        namespace.update(self.copies)
        for name, data in self.pickles.items():
            try:
                import pickle

                namespace[name] = pickle.loads(data)
            except Exception:  # left as the code left it
                pass


def _has_mutating_node(tree):
    """Whether the AST `tree` has one of _MUTATING_NODES; quicker than a walk of ast.walk()."""
    pending = [tree]
    while pending:
        node = pending.pop()
        if type(node) in _MUTATING_NODES:  # quicker than isinstance() with 19 classes
            return True
        for field in getattr(node, "_fields", ()):  # not AST nodes (names, None) have none
            child = getattr(node, field, None)
            if type(child) is list:
                pending.extend(child)
            elif isinstance(child, ast.AST):
                pending.append(child)
    return False


def _rebound(names, values):
    """Whether the namespace has names other than `names`, or other `values` for them."""
    namespace = state.namespace
    return (
        len(namespace) != len(names)
        or list(namespace) != names
        or not all(map(operator.is_, values, namespace.values()))
    )


def _definitions_in(cell):
    """The definitions at the top level of `cell`: name -> (kind, source).

    A name that a later statement of the cell binds again is left out.
    """
    found = {}
    for statement in cell.tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kind = "class" if isinstance(statement, ast.ClassDef) else "function"
            # The source from the first decorator on: top-level statements start a line.
            first = min([statement.lineno] + [node.lineno for node in statement.decorator_list])
            span = types.SimpleNamespace(
                lineno=first,
                col_offset=0,
                end_lineno=statement.end_lineno,
                end_col_offset=statement.end_col_offset,
            )
            found[statement.name] = (kind, ast.get_source_segment(cell.code, span))
            continue
        targets = getattr(statement, "targets", None) or [getattr(statement, "target", None)]
        if (
            isinstance(statement, (ast.Assign, ast.AnnAssign))
            and len(targets) == 1
            and isinstance(targets[0], ast.Name)
            and isinstance(statement.value, ast.Lambda)
        ):
            found[targets[0].id] = ("lambda", ast.get_source_segment(cell.code, statement))
            continue
        for node in ast.walk(statement):  # whatever else the statement binds
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                found[node.id] = None
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found[node.name] = None
            elif isinstance(node, ast.alias):
                found[(node.asname or node.name).partition(".")[0]] = None
    return {name: definition for name, definition in found.items() if definition is not None}


def _reachable_names(tree):
    """The names that code of AST `tree` can reach (see Transactions in the docstring)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return _reachable_from(names)


def _reachable_from(names):
    """`names`, and the global names that the session's functions and classes among them
    use, transitively."""
    namespace = state.namespace
    pending, seen = list(names), set()
    while pending:
        for code in session_code(namespace.get(pending.pop(), state.MISSING)):
            for name in _global_names(code, seen):
                if name not in names and name in namespace:
                    names.add(name)
                    pending.append(name)
    return names


def session_code(value):
    """The code of the session's own functions that using `value` may run."""
    namespace = state.namespace
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return [value.__code__] if value.__globals__ is namespace else []
    codes = []
    for cls in (value if isinstance(value, type) else type(value)).__mro__:
        if cls.__dict__.get("__module__") != "__main__":
            continue
        for member in list(cls.__dict__.values()):
            if isinstance(member, (staticmethod, classmethod)):
                functions = [member.__func__]
            elif isinstance(member, property):
                functions = [member.fget, member.fset, member.fdel]
            else:
                functions = [member]
            codes.extend(
                function.__code__ for function in functions
                if isinstance(function, types.FunctionType) and function.__globals__ is namespace
            )
    return codes


def _global_names(code, seen):
    """The names that `code` and the code nested in it use, leaving out code in `seen`."""
    names, pending = [], [code]
    while pending:
        code = pending.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        names.extend(code.co_names)
        pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return names
