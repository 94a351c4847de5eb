"""The code of one execution: its source, its name, and its AST, parsed only when needed.

Each execution is compiled as ``<cell-N>``, its source in linecache for tracebacks.
"""

import ast
import re


class Cell:
    """The code of one execution, parsed to an AST only when something needs the tree."""

    __slots__ = ("code", "filename", "_tree")

    def __init__(self, code, filename):
        self.code = code
        self.filename = filename
        self._tree = None

    @property
    def parsed(self):
        return self._tree is not None

    @property
    def tree(self):
        """The cell's AST; raises SyntaxError (ValueError for a NUL byte) as compile() does."""
        if self._tree is None:
            flags = ast.PyCF_ONLY_AST
            self._tree = compile(self.code, self.filename, "exec", flags, dont_inherit=True)
        return self._tree


# The start of a simple statement that is not an expression: an assignment, an augmented
# assignment, or a statement that begins with a keyword.
_NOT_AN_EXPRESSION = re.compile(
    r"[A-Za-z_][\w.]*\s*(?:[-+*/%@&|^]|//|\*\*|<<|>>)?=(?!=)"
    r"|(?:assert|async|break|class|continue|def|del|for|from|global|if|import|nonlocal|pass"
    r"|raise|return|try|while|with)\b"
)


def may_end_with_expression(code):
    """False when a look at its last line proves that `code` does not end with an expression.

    This spares the common cell that ends with an assignment or an import the parse to an AST,
    which costs about as much again as compiling it.
    """
    code = code.rstrip()
    start = code.rfind("\n") + 1
    last = code[start:]
    if not _NOT_AN_EXPRESSION.match(last):
        return True
    # The last line holds just that statement (no ";") unless it continues earlier lines: then
    # it closes a bracket or a string opened there, or follows a backslash.
    return (
        ";" in last
        or "'" in last
        or '"' in last
        or "\r" in last
        or last.count("(") != last.count(")")
        or last.count("[") != last.count("]")
        or last.count("{") != last.count("}")
        or (start > 0 and code.endswith(("\\", "\\\r"), 0, start - 1))
    )
