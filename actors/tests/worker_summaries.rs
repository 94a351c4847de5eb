//! What a cell's facts tell the predictor of the session's data, with real Python: pandas
//! objects other than frames by their kind (an index with its length), and the literals of the
//! data: the first labels of an index and the frequent values of a text column, and their
//! bounds on huge or hostile data (a million distinct strings, an index of tuples, values that
//! cannot be hashed, values whose every method raises).
//!
//! These tests assume pandas (scripts/test.sh installs it).

use pyvisor_protocol::{CellFacts, ObjectSummary};

#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod common;
#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod executions;
#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod frames;

use executions::{facts, ok};
use frames::start;

fn object<'a>(facts: &'a CellFacts, name: &str) -> &'a ObjectSummary {
    facts
        .objects
        .iter()
        .find(|o| o.name == name)
        .unwrap_or_else(|| panic!("{name} is summarised: {facts:?}"))
}

fn values<'a>(object: &'a ObjectSummary, column: &str) -> &'a [String] {
    &object
        .columns
        .iter()
        .find(|c| c.name == column)
        .unwrap_or_else(|| panic!("{column} is a column of {}", object.name))
        .values
}

#[tokio::test]
async fn facts_carry_index_labels_and_frequent_values_of_text_columns() {
    let mut worker = start().await;
    ok(&mut worker, "import pandas as pd").await;
    let told = facts(
        &mut worker,
        "people = pd.DataFrame({'sex': ['M', 'F', 'M', 'M', 'F', 'X'], 'age': range(6), \
         'pet': pd.Categorical(['cat', 'dog', 'cat', None, 'cat', 'dog'])}, \
         index=['Mike', 'Ann', 'Bob', 'Eve', 'Joe', 'Sue'])\n\
         ages = people.age\n\
         plain = people.reset_index(drop=True)",
    )
    .await;
    let people = object(&told, "people");
    assert_eq!(people.labels, ["Mike", "Ann", "Bob", "Eve", "Joe"]);
    assert_eq!(values(people, "sex"), ["M", "F", "X"]);
    assert_eq!(values(people, "pet"), ["cat", "dog"]);
    assert!(values(people, "age").is_empty(), "numbers are not listed");
    let ages = object(&told, "ages");
    assert_eq!(ages.labels, people.labels);
    assert!(ages.columns[0].values.is_empty());
    let plain = object(&told, "plain");
    assert_eq!(plain.index.as_deref(), Some("RangeIndex"));
    assert!(
        plain.labels.is_empty(),
        "a RangeIndex has no labels to tell"
    );
    assert_eq!(values(plain, "sex"), ["M", "F", "X"]);
}

#[tokio::test]
async fn an_index_and_a_groupby_are_told_by_their_kind() {
    let mut worker = start().await;
    ok(&mut worker, "import pandas as pd").await;
    let told = facts(
        &mut worker,
        "df = pd.DataFrame({'team': ['a', 'b', 'a'], 'pay': [1, 2, 3]})\n\
         names = df.columns[:-1]\n\
         by_team = df.groupby('team')",
    )
    .await;
    let names = object(&told, "names");
    assert_eq!((names.kind.as_str(), names.len), ("Index", Some(1)));
    let by_team = object(&told, "by_team");
    assert_eq!(by_team.kind, "DataFrameGroupBy");
    assert_eq!(by_team.len, None, "counting groups would group");
    assert!(by_team.columns.is_empty());
}

#[tokio::test]
async fn literals_stay_bounded_on_huge_or_hostile_data() {
    let mut worker = start().await;
    ok(
        &mut worker,
        "import pandas as pd\n\
         class Hostile:\n\
         \x20   def __hash__(self): raise RuntimeError('hash')\n\
         \x20   def __eq__(self, other): raise RuntimeError('eq')\n\
         \x20   def __repr__(self): raise RuntimeError('repr')\n\
         \x20   def __len__(self): raise RuntimeError('len')\n\
         class Sly(str):\n\
         \x20   def __hash__(self): raise RuntimeError('hash')",
    )
    .await;
    let told = facts(
        &mut worker,
        "big = pd.DataFrame({'s': [f'v{i}' for i in range(10**6)]}, \
         index=[f'r{i}' for i in range(10**6)])\n\
         tuples = pd.DataFrame({'a': [1, 2]}, index=pd.MultiIndex.from_tuples([('x', 1), ('y', 2)]))\n\
         pairs = pd.Series([1, 2], index=pd.Index([('x', 1), ('y', 2)], tupleize_cols=False))\n\
         lists = pd.DataFrame({'l': [[1], [2], [1]], 'd': [{'a': 1}, {}, {}]})\n\
         hostile = pd.DataFrame({'h': [Hostile(), Hostile()], 's': [Sly('a'), Sly('b')], \
         'ok': ['x', 'y']})\n\
         long = pd.DataFrame({'s': ['x' * 100, 'y' * 100, 'fine']}, index=['z' * 100, 'a', 'b'])\n\
         wide = pd.DataFrame({f'c{i}': [f'{i}-{j}-' + 'w' * 30 for j in range(5)] * 2 \
         for i in range(100)}, index=[str(i) for i in range(10)])",
    )
    .await;
    let big = object(&told, "big");
    assert_eq!(big.len, Some(1_000_000));
    assert_eq!(big.labels, ["r0", "r1", "r2", "r3", "r4"]);
    assert!(
        values(big, "s").is_empty(),
        "a column of distinct strings lists none"
    );
    assert!(object(&told, "tuples").labels.is_empty());
    assert!(object(&told, "pairs").labels.is_empty());
    let lists = object(&told, "lists");
    assert!(values(lists, "l").is_empty() && values(lists, "d").is_empty());
    let hostile = object(&told, "hostile");
    assert!(values(hostile, "h").is_empty() && values(hostile, "s").is_empty());
    assert_eq!(values(hostile, "ok"), ["x", "y"]);
    let long = object(&told, "long");
    assert_eq!(
        long.labels,
        ["a", "b"],
        "labels past 40 characters are left out"
    );
    assert_eq!(values(long, "s"), ["fine"]);
    // 100 columns of 5 values of 35 bytes, and 5 labels: the object's literals stop at 2 kB.
    let wide = object(&told, "wide");
    let literals: Vec<&String> = wide
        .labels
        .iter()
        .chain(wide.columns.iter().flat_map(|c| &c.values))
        .collect();
    let bytes: usize = literals.iter().map(|l| l.len()).sum();
    assert!(bytes <= 2048, "{bytes} bytes of literals");
    assert!(wide.columns.iter().filter(|c| !c.values.is_empty()).count() <= 16);
    assert!(wide.columns.iter().all(|c| c.values.len() <= 5));
    assert_eq!(wide.labels.len(), 5);
}
