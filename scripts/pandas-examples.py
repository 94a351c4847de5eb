"""The examples of the installed pandas's docstrings as a facts trace: the predictor's second
source of vocabulary for swapping one member for another (`s.max()` then `s.median()`),
beside the training corpus, so that members the corpus wrote in few places are still known.

    python3 scripts/pandas-examples.py OUT.jsonl

Each docstring of a public member of the classes below (and of `pandas` itself) is one
sequence, each `>>>` statement with its `...` lines one cell. Only the code and the names it
binds are recorded (nothing is run); `learn_templates --vocabulary OUT.jsonl` reads it.
"""
import ast
import inspect
import json
import sys

import pandas as pd
from pandas.core.groupby import DataFrameGroupBy, SeriesGroupBy
from pandas.core.window.rolling import Rolling

DOCUMENTED = {
    "DataFrame": pd.DataFrame,
    "Series": pd.Series,
    "Index": pd.Index,
    "DataFrameGroupBy": DataFrameGroupBy,
    "SeriesGroupBy": SeriesGroupBy,
    "Rolling": Rolling,
    "str": pd.Series.str,
    "dt": pd.Series.dt,
    "pandas": pd,
}


def examples(doc):
    """The statements of a docstring's `>>>` examples, continuation lines joined."""
    cells, current = [], None
    for line in doc.splitlines():
        text = line.strip()
        if text.startswith(">>> "):
            if current is not None:
                cells.append(current)
            current = text[4:]
        elif current is not None and (text.startswith("... ") or text == "..."):
            current += "\n" + text[4:]
        elif current is not None:
            cells.append(current)
            current = None
    if current is not None:
        cells.append(current)
    return cells


def bound(code):
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    names = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return sorted(set(names))


def main(out_path):
    seen = set()
    cells = 0
    with open(out_path, "w") as out:
        for owner, cls in DOCUMENTED.items():
            for name in sorted(dir(cls)):
                if name.startswith("_"):
                    continue
                try:
                    doc = inspect.getdoc(getattr(cls, name)) or ""
                except Exception:  # a member that cannot be read is not documented here
                    continue
                if not doc or doc in seen:
                    continue
                seen.add(doc)
                sequence = f"pandas.docstrings--{owner}-{name}"
                for index, code in enumerate(examples(doc)):
                    binds = bound(code)
                    facts = {
                        "reads": [],
                        "binds": binds,
                        "touched": binds,
                        "files": [],
                        "ambient": "",
                        "objects": [],
                        "pure": False,
                        "cost_ms": 0.0,
                    }
                    cell = {"sequence": sequence, "index": index, "code": code, "status": "ok",
                            "facts": facts, "duration_ms": 0.0}
                    out.write(json.dumps(cell) + "\n")
                    cells += 1
    print(f"pandas {pd.__version__}: {cells} example cells from {len(seen)} docstrings", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 scripts/pandas-examples.py OUT.jsonl")
    main(sys.argv[1])
