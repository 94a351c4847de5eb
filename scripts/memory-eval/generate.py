#!/usr/bin/env python3
"""Generates the labelled corpus of `pyvisor memory eval` (corpus.json beside this file).

Owners (agents) run sessions of pandas work against pandas 3. Some owners have habits: they
keep reaching for an approach that fails (pandas 3 removed APIs: fillna(method=...), the
frequency aliases 'H' and 'M', DataFrame.append, read_csv(squeeze=...); a wrong column name; a
dtype error), once in a while, in a new session, fixing it each time. Other owners never repeat
a failure. Everyone also makes one-off mistakes (typos, off-by-one, division by zero) and
runs plenty of code that works, some of it close to the failing approaches (df.ffill(),
freq='h', pd.concat) to catch insights that fire on the fix.

The label of a step: an insight is expected when the step repeats an approach (a family of
failing code) that already failed at least twice for this owner and never worked for it, and
the step is not the first of its session. Everything else expects no insight. The labels know
nothing of the similarity measure: they come from the families the generator drew from.

Usage: python3 scripts/memory-eval/generate.py [OUTPUT [SEED]]   (deterministic; seed 14 by
default. corpus.json is seed 14, on which the detector was developed; heldout.json is seed 15,
generated once the detector's design was settled and only checked against since.)
"""

import json
import random
import sys
from pathlib import Path

SEED = 14
OWNERS_WITH_HABITS = 6
OWNERS_WITHOUT = 4
SESSIONS_PER_OWNER = 12

SETUP = (
    "import io\nimport pandas as pd\n"
    "{df} = pd.DataFrame({{'price': [1.0, None, 3.0, 4.0], 'qty': ['1', '2', '3', '4'], "
    "'city': ['a', 'b', 'a', 'c']}})"
)

NAMES = ["df", "data", "sales", "frame", "orders", "table", "raw", "prices"]
RESULTS = ["out", "result", "filled", "clean", "res", "tmp", "x", "view"]


def fillna_method(r, df):
    how = r.choice(["ffill", "bfill"])
    out = r.choice(RESULTS + [df])
    fail = r.choice([
        f"{out} = {df}.fillna(method='{how}')",
        f"{out} = {df}.fillna(method=\"{how}\")\n{out}.head()",
        f"{df}.fillna(method='{how}', inplace=True)",
    ])
    fix = f"{out} = {df}.{how}()"
    return fail, fix


def freq_hourly(r, df):
    n = r.choice([6, 12, 24, 48, 72])
    idx = r.choice(["idx", "hours", "index", "rng"])
    fail = r.choice([
        f"{idx} = pd.date_range('2024-01-01', periods={n}, freq='H')",
        f"{idx} = pd.date_range(start='2024-03-01', periods={n}, freq='H')\nlen({idx})",
    ])
    fix = fail.replace("'H'", "'h'")
    return fail, fix


def freq_month_end(r, df):
    s = r.choice(["daily", "series", "s", "ts"])
    agg = r.choice(["sum", "mean"])
    head = f"{s} = pd.Series(range(90), index=pd.date_range('2024-01-01', periods=90, freq='D'))\n"
    fail = head + f"{s}.resample('M').{agg}()"
    fix = head + f"{s}.resample('ME').{agg}()"
    return fail, fix


def df_append(r, df):
    row = r.choice(["{'price': 5.0}", "{'price': 9.5, 'qty': '7'}", "new_row"])
    pre = "new_row = {'price': 2.5}\n" if row == "new_row" else ""
    fail = pre + f"{df} = {df}.append({row}, ignore_index=True)"
    fix = pre + f"{df} = pd.concat([{df}, pd.DataFrame([{row}])], ignore_index=True)"
    return fail, fix


def read_csv_squeeze(r, df):
    var = r.choice(["s", "col", "series", "values"])
    text = r.choice(["'a\\n1\\n2\\n3'", "'v\\n4\\n5'", "'n\\n7'"])
    fail = f"{var} = pd.read_csv(io.StringIO({text}), squeeze=True)"
    fix = f"{var} = pd.read_csv(io.StringIO({text})).squeeze('columns')"
    return fail, fix


def wrong_column(r, df):
    agg = r.choice(["mean", "sum", "max"])
    fail = r.choice([
        f"{df}['Price'].{agg}()",
        f"total = {df}['Price'].{agg}()\ntotal",
    ])
    fix = fail.replace("'Price'", "'price'")
    return fail, fix


def dtype_error(r, df):
    n = r.choice([2, 3, 10])
    fail = r.choice([
        f"{df}['qty'].sum() / {n}",
        f"avg = {df}['qty'].sum() / {n}\navg",
    ])
    fix = fail.replace(f"{df}['qty'].sum()", f"pd.to_numeric({df}['qty']).sum()")
    return fail, fix


FAMILIES = {
    "fillna_method": fillna_method,
    "freq_hourly": freq_hourly,
    "freq_month_end": freq_month_end,
    "df_append": df_append,
    "read_csv_squeeze": read_csv_squeeze,
    "wrong_column": wrong_column,
    "dtype_error": dtype_error,
}


ONE_OFFS = [
    "print({name})",
    "{name}_total = {name}_count + {k}",
    "[1, 2, 3][{k}]",
    "{k} / (len({df}) - len({df}))",
    "{{'a': 1}}['{name}']",
    "int('{name}')",
    "assert len({df}) == {k} + 10, 'expected more rows'",
    "import {name}_lib",
    "{df}.loc[{k} + 100]",
    "sorted([{k}, '{name}'])",
    "{df}.iloc[:, {k}]",
    "open('/nonexistent/{name}.csv').read()",
    "{df}.merge({df}, on='{name}')",
    "{df}.rename(columns={{'price': 'cost'}})['price']",
    "float('{name}') * {k}",
    "{df}.groupby('{name}').size()",
    "tuple(range({k}))[{k}]",
    "dict(a=1).pop('{name}')",
    "{df}.astype({{'city': 'int64'}})",
    "'{name}'.index('zz')",
    "{df}.set_index('city').loc['{name}']",
    "next(iter([]))",
    "import math\nmath.sqrt(-{k})",
    "{df}['price'].astype('int64')",
]


def one_off_failure(r, df, unused):
    """A mistake this owner makes once: each kind at most once per owner."""
    if not unused:
        unused.extend(range(len(ONE_OFFS)))
        r.shuffle(unused)
    name = "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randint(4, 9)))
    return ONE_OFFS[unused.pop()].format(name=name, k=r.randint(3, 99), df=df)


def filler(r, df):
    """Code that works."""
    col = r.choice(["price", "city"])
    k = r.randint(1, 4)
    return r.choice([
        f"{df}.head({k})",
        f"{df}.describe()",
        f"{df}['price'].fillna(0).sum()",
        f"{df}.groupby('city')['price'].mean()",
        f"{df}.shape",
        f"{df}['{col}'].value_counts()",
        f"{df}.dropna().reset_index(drop=True)",
        f"len({df})",
        f"{df}.ffill().head({k})",
        f"pd.date_range('2024-01-01', periods={k + 2}, freq='h')",
        f"pd.concat([{df}, {df}]).shape",
        f"{df}.sort_values('price', ascending={r.choice(['True', 'False'])})",
        f"{df}['price'].max() - {df}['price'].min()",
        f"{df}.assign(double={df}['price'] * 2).tail({k})",
        f"{df}.isna().sum()",
        f"pd.to_numeric({df}['qty']).mean()",
    ])


def session(r, owner, index, habits, history, unused):
    """One session's steps; `history` is the owner's per-family (failures, successes)."""
    df = r.choice(NAMES)
    steps = [{"code": SETUP.format(df=df), "expect_insight": False, "label": "setup"}]

    def add(code, label, expect=False, meta=None):
        step = {"code": code, "expect_insight": expect, "label": label}
        if meta:
            step["meta"] = meta
        steps.append(step)

    for _ in range(r.randint(1, 3)):
        add(filler(r, df), "works")
    if r.random() < 0.7:
        add(one_off_failure(r, df, unused), "one_off")
    attempts = [f for f in habits if r.random() < 0.5]
    r.shuffle(attempts)
    for family in attempts[:2]:
        fail, fix = FAMILIES[family](r, df)
        failures, successes = history.setdefault(family, [0, 0])
        expect = failures >= 2 and successes == 0
        add(fail, family, expect, {"approach": f"{family} (pandas 2 habit)"})
        history[family][0] += 1
        for _ in range(r.randint(0, 1)):
            add(filler(r, df), "works")
        add(fix, f"{family}_fix", False, {"approach": f"{family} fixed"})
        for _ in range(r.randint(2, 3)):
            add(filler(r, df), "works")
    if r.random() < 0.5:
        add(one_off_failure(r, df, unused), "one_off")
    for _ in range(r.randint(0, 2)):
        add(filler(r, df), "works")
    return {"name": f"{owner}-s{index:02}", "owner": owner, "steps": steps}


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("corpus.json")
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else SEED
    r = random.Random(seed)
    families = sorted(FAMILIES)
    sequences = []
    owners = [(f"habit-{i}", r.sample(families, r.randint(2, 3))) for i in range(OWNERS_WITH_HABITS)]
    owners += [(f"careful-{i}", []) for i in range(OWNERS_WITHOUT)]
    per_owner = {}
    for owner, habits in owners:
        history, unused = {}, []
        per_owner[owner] = [
            session(r, owner, s, habits, history, unused) for s in range(SESSIONS_PER_OWNER)
        ]
    # Owners take turns, as concurrent agents would; each owner's own order is kept.
    for s in range(SESSIONS_PER_OWNER):
        for owner, _ in owners:
            sequences.append(per_owner[owner][s])
    steps = [step for seq in sequences for step in seq["steps"]]
    expected = sum(step["expect_insight"] for step in steps)
    failing_labels = set(FAMILIES) | {"one_off"}
    failing = sum(step["label"] in failing_labels for step in steps)
    corpus = {
        "description": __doc__.strip().splitlines()[0],
        "generator": "scripts/memory-eval/generate.py",
        "seed": seed,
        "sequences": sequences,
    }
    out.write_text(json.dumps(corpus, indent=1) + "\n")
    print(
        f"{out}: {len(sequences)} sequences, {len(steps)} steps, {failing} failing, "
        f"{expected} expect an insight ({expected / failing:.1%} of failing steps)"
    )


if __name__ == "__main__":
    main()
