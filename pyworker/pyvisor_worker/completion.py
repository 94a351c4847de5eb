"""Complete: the names and attributes that can finish the word before the cursor, for the
REPL's Tab key, from the session's namespace, the way rlcompleter completes.

The request is {"type": "complete", "id", "text", "cursor"}, the cursor counted in characters
of text; the reply {"type": "complete_done", "id", "matches": [...]}, each match replacing the
word before the cursor: the run of identifier characters and dots that ends there.

- Without a dot, the matches are the keywords, the namespace's names and the builtins that
  start with the word.
- With dots, the part before the last dot must be a plain dotted name (``df.columns``; never
  a call, a subscript or any other expression, so nothing is called). Its first name is looked
  up in the namespace (then the builtins) and each further part with getattr, as rlcompleter's
  eval of that dotted name does: a property or ``__getattr__`` of those objects runs, nothing
  else. The matches are the attributes dir() lists that start with the part after the dot.
- A callable match ends with "(" as in rlcompleter, told with inspect.getattr_static, which
  runs no property and no ``__getattr__`` of the last object.
- Names that start with "_" are offered only when the typed part starts with "_".

The main thread serves it between executions, in order with them (never while code runs: the
host answers for the worker then), so a lookup never races the session's code.
"""

import builtins
import keyword

from pyvisor_worker import state

MAX_MATCHES = 1000

# What rlcompleter puts after a keyword: a space, but for those that take no expression.
_KEYWORD_ENDS = {"try": ":", "finally": ":", "else": "", "pass": "", "break": "",
                 "continue": "", "True": "", "False": "", "None": ""}


def complete(request):
    """The complete_done reply; never fails (no matches when the word cannot be completed)."""
    text, cursor = request.get("text"), request.get("cursor")
    matches = []
    if type(text) is str and type(cursor) is int and 0 <= cursor <= len(text):
        try:
            matches = _matches(_word_before(text[:cursor]))
        except Exception:  # a lookup or dir() that fails offers nothing
            matches = []
    return {"type": "complete_done", "id": request.get("id"), "matches": matches[:MAX_MATCHES]}


def _word_before(text):
    """The run of identifier characters and dots at the end of `text`."""
    start = len(text)
    while start > 0 and (text[start - 1].isidentifier() or text[start - 1].isdigit()
                         or text[start - 1] == "."):
        start -= 1
    return text[start:]


def _matches(word):
    if "." not in word:
        return _global_matches(word)
    base, _, part = word.rpartition(".")
    names = base.split(".")
    if not all(name.isidentifier() and not keyword.iskeyword(name) for name in names):
        return []  # `1.5`, `a..b`, `x.1`: not a dotted name
    missing = object()
    value = state.namespace.get(names[0], missing)
    if value is missing:
        value = getattr(builtins, names[0], missing)
    if value is missing:
        return []
    for name in names[1:]:
        value = getattr(value, name)
    return ["%s.%s" % (base, name) for name in _attributes(value, part)]


def _global_matches(word):
    found = set()
    for name in keyword.kwlist:
        if name.startswith(word):
            found.add(name + _KEYWORD_ENDS.get(name, " "))
    for scope in (list(state.namespace.items()), list(vars(builtins).items())):
        for name, value in scope:
            if name.startswith(word) and _shown(name, word):
                found.add(name + "(" if callable(value) else name)
    return sorted(found)


def _attributes(value, part):
    import inspect

    found = set()
    for name in dir(value):
        if type(name) is not str or not name.startswith(part) or not _shown(name, part):
            continue
        try:
            attribute = inspect.getattr_static(value, name)
        except AttributeError:
            found.add(name)
            continue
        if isinstance(attribute, (staticmethod, classmethod)):
            attribute = attribute.__func__
        found.add(name + "(" if callable(attribute) else name)
    return sorted(found)


def _shown(name, typed):
    """rlcompleter's rule: private names only when the user typed the underscore."""
    return typed.startswith("_") or not name.startswith("_")
