"""The static purity guard: whether a snippet can be run speculatively and its answer served.

``check(code, namespace)`` is None when the code is pure, else a short reason. Pure means: the
code parses to a single expression statement (comments aside) in which nothing below occurs.
It is a conservative deny-list over the AST, with the namespace consulted only to tell what a
name is bound to (never calling the session's code); names that are not bound are fine, since
that run raises NameError, and an error is never served. The tables:

- _STATEMENT_REASONS: nodes that bind, delete, import, define, or suspend;
- stores and deletes through attributes and subscripts (``df.loc[0] = 1``);
- keyword ``inplace=`` with any value but a literal False, and ``out=`` or ``target=`` with
  any value but a literal None (``np.add(a, 1, out=a)``);
- _MUTATING_METHODS, _WRITING_METHODS, _PLOTTING_METHODS, _CLOCK_METHODS, _RANDOM_METHODS:
  calls of methods of these names, on anything (and of anything under a ``random``
  attribute); and calls of any dunder method;
- _BUILTIN_REASONS: calls of these builtins (by name, when the name is not rebound);
- _MODULE_REASONS: calls of anything reached from a module whose name starts with one of these
  (``os.getcwd()``, ``time.time()``, ``from time import time``), or a method of an object of
  such a module (``ax.set_title()`` on a matplotlib Axes);
- open() with a mode that writes;
- a callable that any of the above would refuse to call, handed on rather than called
  (``df.path.map(os.remove)``, ``map(eval, xs)``): whatever it is handed to calls it;
- values read whose use may run or change hidden state: the session's own functions, classes
  and instances of its classes (their code may change anything), iterators and generators
  (reading consumes them), open files, and random generators.

A call of the session's code hidden in a container (``handlers["f"]()``) is not seen here; the
speculative run still checks afterwards that nothing was rebound and that what was read did
not change.
"""

import ast
import io
import types

from pyvisor_worker import changes

_STATEMENT_REASONS = {
    ast.Assign: "assigns", ast.AugAssign: "assigns", ast.AnnAssign: "assigns",
    ast.NamedExpr: "assigns", ast.Delete: "deletes", ast.Global: "declares globals",
    ast.Nonlocal: "declares globals", ast.Import: "imports", ast.ImportFrom: "imports",
    ast.FunctionDef: "defines", ast.AsyncFunctionDef: "defines", ast.ClassDef: "defines",
    ast.Await: "awaits", ast.Yield: "yields", ast.YieldFrom: "yields",
}

_MUTATING_METHODS = frozenset((
    "append", "extend", "insert", "pop", "remove", "clear", "update", "sort", "reverse",
    "setdefault", "popitem", "add", "discard", "intersection_update", "difference_update",
    "symmetric_difference_update", "fill", "resize", "put", "itemset", "setflags", "byteswap",
    "seek", "read", "readline", "readlines", "close", "send", "throw",
    "set_option", "reset_option", "set_printoptions", "seed",
    # numpy's functions and methods that write into an array they are handed
    "place", "putmask", "copyto", "fill_diagonal", "put_along_axis", "partition", "at",
    "setfield",
))
# Keywords naming an object a call writes its result into (np.add(a, 1, out=a)).
_WRITING_KEYWORDS = frozenset(("out", "target"))
_WRITING_METHODS = frozenset((
    "to_csv", "to_excel", "to_json", "to_parquet", "to_pickle", "to_sql", "to_hdf",
    "to_feather", "to_clipboard", "to_stata", "to_orc", "to_latex", "to_html", "to_markdown",
    "to_string", "to_xml", "savefig", "save", "savez", "savetxt", "tofile", "write",
    "writelines", "dump", "write_text", "write_bytes", "unlink", "mkdir", "rmdir", "rename",
    "replace_file", "touch", "chmod", "read_sql", "read_sql_query", "read_sql_table",
))
_PLOTTING_METHODS = frozenset((
    "plot", "hist", "boxplot", "show", "figure", "scatter", "bar", "barh", "pie", "imshow",
    "subplots", "heatmap", "kde", "area", "line", "density", "scatter_matrix",
))
_CLOCK_METHODS = frozenset(("now", "today", "utcnow"))
_RANDOM_METHODS = frozenset(("sample", "shuffle", "permutation"))

_BUILTIN_REASONS = {
    "input": "asks for input", "id": "uses identities", "hash": "uses hash randomisation",
    "exec": "runs dynamic code", "eval": "runs dynamic code", "compile": "runs dynamic code",
    "__import__": "imports", "globals": "touches the namespace", "locals": "touches the namespace",
    "vars": "touches the namespace", "setattr": "sets attributes", "delattr": "sets attributes",
    "getattr": "gets attributes by name", "next": "consumes an iterator",
    "breakpoint": "debugs", "exit": "exits", "quit": "exits", "help": "asks for input",
}

_MODULE_REASONS = (
    ("os", "uses the system"), ("posix", "uses the system"), ("shutil", "uses the system"),
    ("subprocess", "uses the system"), ("socket", "uses the network"),
    ("signal", "uses the system"), ("sys", "uses the system"), ("io", "uses the system"),
    ("pathlib", "uses the system"), ("tempfile", "uses the system"),
    ("glob", "uses the system"), ("threading", "uses the system"),
    ("multiprocessing", "uses the system"), ("asyncio", "uses the system"),
    ("ctypes.util", "uses the system"), ("sqlite3", "uses a database"),
    ("urllib", "uses the network"), ("http", "uses the network"),
    ("requests", "uses the network"), ("webbrowser", "uses the system"),
    ("random", "is random"), ("numpy.random", "is random"), ("secrets", "is random"),
    ("uuid", "is random"), ("time", "reads the clock"), ("getpass", "asks for input"),
    ("pyvisor_worker", "asks for input"), ("pickle", "uses the system"),
    ("matplotlib", "plots"), ("seaborn", "plots"), ("plotly", "plots"),
    ("pdb", "debugs"), ("gc", "uses the system"), ("importlib", "imports"),
)

_WRITE_MODE = frozenset("wax+")
_DEFINED = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def check(code, namespace, tree=None):
    """None when `code` is pure (see the module docstring), else why it is not."""
    if tree is None:
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError):
            return "does not parse"
    reason = check_node(tree, namespace)
    if reason is None and (len(tree.body) != 1 or type(tree.body[0]) is not ast.Expr):
        return "is not a single expression"
    return reason


def check_node(tree, namespace):
    """None when nothing in the AST `tree` is impure, else why it is not."""
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        reason = _STATEMENT_REASONS.get(type(node))
        if reason is None:
            reason = _node_reason(node, namespace, called)
        if reason is not None:
            return reason
    return None


def _node_reason(node, namespace, called):
    """Why `node` is not pure, if it is not; `called` holds the ids of the nodes called."""
    if isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(node.ctx, ast.Load):
        return "assigns"
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        value = namespace.get(node.id, _UNBOUND)
        reason = _value_reason(value)
        if reason is None and id(node) not in called:
            reason = _handed_reason(node.id, [], value)
        return reason
    if isinstance(node, ast.Attribute) and id(node) not in called:
        chain, root = _attribute_chain(node)
        if root is not None:
            return _handed_reason(root, chain, namespace.get(root, _UNBOUND))
    if isinstance(node, ast.keyword) and node.arg == "inplace":
        if not (isinstance(node.value, ast.Constant) and node.value.value is False):
            return "changes an object in place"
    if isinstance(node, ast.keyword) and node.arg in _WRITING_KEYWORDS:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            return "writes into an object it is handed"
    if isinstance(node, ast.Call):
        return _call_reason(node, namespace)
    return None


def _call_reason(call, namespace):
    chain, root = _attribute_chain(call.func)
    method = chain[-1] if chain else None
    if method is not None:
        if method.startswith("__") and method.endswith("__"):
            return "calls a special method"
        if method in _MUTATING_METHODS:
            return "calls ." + method
        if method in _WRITING_METHODS:
            return "writes"
        if method in _PLOTTING_METHODS:
            return "plots"
        if method in _CLOCK_METHODS:
            return "reads the clock"
        if method in _RANDOM_METHODS or "random" in chain:
            return "is random"
    if root is None:
        return None
    value = namespace.get(root, _UNBOUND)
    if value is _UNBOUND and not chain:
        if root == "open":
            return _open_reason(call)
        return _BUILTIN_REASONS.get(root)
    return _module_reason(_resolve(value, chain))


def _handed_reason(root, chain, value):
    """Why handing on ``root.<chain>`` uncalled is not pure: it is a builtin or a function of a
    module that a call of it would be refused for."""
    if value is _UNBOUND and not chain:
        return _BUILTIN_REASONS.get(root)
    reached = _resolve(value, chain)
    return _module_reason(reached) if isinstance(reached, _DEFINED) else None


def _attribute_chain(func):
    """(["a", "b"], "x") for ``x.a.b``; ([...], None) when the chain starts at no name."""
    chain = []
    while isinstance(func, ast.Attribute):
        chain.append(func.attr)
        func = func.value
    chain.reverse()
    return chain, func.id if isinstance(func, ast.Name) else None


def _resolve(value, chain):
    """The module-level object that ``value.<chain>`` reaches, through modules only."""
    for attribute in chain:
        if not isinstance(value, types.ModuleType):
            break
        value = vars(value).get(attribute, _UNBOUND)
    return value


def _module_reason(value):
    """The reason of _MODULE_REASONS that the module `value` comes from, if any."""
    if isinstance(value, types.ModuleType):
        module = getattr(value, "__name__", "")
    elif isinstance(value, _DEFINED):
        module = getattr(value, "__module__", None)
    else:  # an instance: its class's module, without looking up the instance's attributes
        module = type(value).__module__
    if not isinstance(module, str):
        return None
    for prefix, reason in _MODULE_REASONS:
        if module == prefix or module.startswith(prefix + "."):
            return reason
    return None


def _open_reason(call):
    mode = call.args[1] if len(call.args) > 1 else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if mode is None:
        return None
    if not (isinstance(mode, ast.Constant) and isinstance(mode.value, str)):
        return "opens a file in an unknown mode"
    return "writes" if _WRITE_MODE.intersection(mode.value) else None


_UNBOUND = object()


def _value_reason(value):
    """Why reading `value` is not pure, if it is not: its use runs or changes hidden state."""
    if value is _UNBOUND or isinstance(value, types.ModuleType):
        return None
    if changes.session_code(value):
        return "calls the session's code"
    kind = type(value)
    if hasattr(kind, "__next__") or isinstance(value, types.GeneratorType):
        return "consumes an iterator"
    if isinstance(value, io.IOBase):
        return "reads a file object"
    module = kind.__module__
    if module == "random" or module.startswith("numpy.random"):
        return "is random"
    return None


def binding_names(tree, namespace):
    """The names that `tree` binds, when its only impurity is plain assignments of pure
    expressions to names (``y = x * 2``), maybe followed by a pure expression; else None."""
    names = []
    for statement in tree.body:
        if type(statement) is ast.Assign and all(
                type(target) is ast.Name for target in statement.targets):
            names.extend(target.id for target in statement.targets)
        elif type(statement) is not ast.Expr or statement is not tree.body[-1]:
            return None
        if check_node(statement.value, namespace) is not None:
            return None
    return names or None
