//! Candidate generation on synthetic sessions, against the committed table: what a session
//! that just loaded a CSV is offered, which columns get `value_counts`, hints and what builds
//! on them, and how recorded outcomes move the ranking.

use pyvisor_protocol::messages::{CellFacts, ColumnSummary, ObjectSummary};

use super::{Followers, Learned, Prediction, SessionModel, Source, Table};

/// A string-labelled column without nulls.
pub(super) fn column(name: &str, dtype: &str, distinct: u64) -> ColumnSummary {
    ColumnSummary {
        name: name.to_string(),
        label_is_str: true,
        dtype: dtype.to_string(),
        nulls: 0,
        distinct,
        values: Vec::new(),
    }
}

/// A 1000-row DataFrame with a RangeIndex and `columns`.
pub(super) fn frame(name: &str, columns: Vec<ColumnSummary>) -> ObjectSummary {
    ObjectSummary {
        name: name.to_string(),
        kind: "DataFrame".to_string(),
        module: "pandas".to_string(),
        len: Some(1000),
        shape: vec![1000, columns.len() as u64],
        columns,
        index: Some("RangeIndex".to_string()),
        labels: Vec::new(),
    }
}

fn facts(binds: &[&str], objects: Vec<ObjectSummary>) -> CellFacts {
    CellFacts {
        binds: binds.iter().map(|s| s.to_string()).collect(),
        touched: Some(binds.iter().map(|s| s.to_string()).collect()),
        objects,
        ..CellFacts::default()
    }
}

fn sales() -> ObjectSummary {
    frame(
        "sales",
        vec![
            column("city", "str", 5),
            column("customer", "str", 990),
            column("price", "float64", 700),
            column("units", "int64", 12),
        ],
    )
}

/// A session that imported pandas and just read a CSV.
fn loaded() -> SessionModel {
    let mut model = SessionModel::new();
    model.observe("import pandas as pd", &facts(&["pd"], vec![]), true);
    model.observe(
        "sales = pd.read_csv('sales.csv')",
        &facts(&["sales"], vec![sales()]),
        true,
    );
    model
}

/// The session reads a second frame like the first, `returns`.
fn read_returns(model: &mut SessionModel) {
    let mut other = sales();
    other.name = "returns".to_string();
    model.observe(
        "returns = pd.read_csv('returns.csv')",
        &facts(&["returns"], vec![other]),
        true,
    );
}

fn codes(predictions: &[Prediction]) -> Vec<&str> {
    predictions.iter().map(|p| p.normal.as_str()).collect()
}

#[test]
fn a_frame_just_read_is_displayed_and_inspected() {
    let model = loaded();
    let predictions = model.predict(Table::builtin(), &Learned::new(), 10);
    let top = codes(&predictions);
    assert!(top.contains(&"sales.head()"), "{top:?}");
    assert!(top.contains(&"sales"), "{top:?}");
    assert!(predictions.iter().all(|p| p.after.is_none()));
    for pair in predictions.windows(2) {
        assert!(pair[0].expected_saving() >= pair[1].expected_saving());
    }
}

#[test]
fn value_counts_are_guessed_for_few_valued_columns_only() {
    let mut model = loaded();
    model.observe("sales.head()", &facts(&[], vec![]), true);
    model.observe("sales['units'].value_counts()", &facts(&[], vec![]), true);
    let predictions = model.predict(Table::builtin(), &Learned::new(), 200);
    let listing: Vec<&str> = codes(&predictions)
        .into_iter()
        .filter(|c| c.contains("value_counts") || c.contains("unique("))
        .collect();
    assert!(
        listing.iter().any(|c| c.contains("city")),
        "the five-valued column is listed: {listing:?}"
    );
    for code in &listing {
        assert!(
            !code.contains("customer") && !code.contains("price"),
            "{code} lists a column of many values"
        );
    }
}

#[test]
fn hints_come_first_and_an_assignment_brings_what_follows_it() {
    let mut model = loaded();
    model.hint(vec![
        "sales.describe()".to_string(),
        "stock = pd.read_csv('stock.csv')".to_string(),
    ]);
    let predictions = model.predict(Table::builtin(), &Learned::new(), 30);
    assert_eq!(predictions[0].normal, "sales.describe()");
    assert_eq!(predictions[0].source, Source::Hint);
    assert_eq!(predictions[1].normal, "stock=pd.read_csv('stock.csv')");
    let children: Vec<&Prediction> = predictions.iter().filter(|p| p.after == Some(1)).collect();
    assert!(
        children
            .iter()
            .any(|p| p.normal == "stock.head()" || p.normal == "stock"),
        "{children:?}"
    );
    model.observe("sales.describe()", &facts(&[], vec![]), true);
    let predictions = model.predict(Table::builtin(), &Learned::new(), 30);
    assert_eq!(predictions[0].normal, "stock=pd.read_csv('stock.csv')");
}

#[test]
fn recorded_misses_push_a_guess_down() {
    let model = loaded();
    let table = Table::builtin();
    let mut learned = Learned::new();
    let before = model.predict(table, &learned, 30);
    let first = before[0].clone();
    for _ in 0..30 {
        learned.record(first.source, &first.template, false);
    }
    let after = model.predict(table, &learned, 30);
    let rank = after.iter().position(|p| p.normal == first.normal);
    assert!(
        rank.is_none_or(|r| r > 0),
        "{} stays first after 30 misses",
        first.normal
    );
}

#[test]
fn a_new_frame_gets_what_the_session_did_to_the_last_one() {
    let mut model = loaded();
    model.observe("sales.shape", &facts(&[], vec![]), true);
    model.observe("sales.dtypes", &facts(&[], vec![]), true);
    read_returns(&mut model);
    let predictions = model.predict(Table::builtin(), &Learned::new(), 30);
    let history: Vec<&str> = predictions
        .iter()
        .filter(|p| p.source == Source::History)
        .map(|p| p.normal.as_str())
        .collect();
    assert!(history.contains(&"returns.dtypes"), "{history:?}");
    assert!(codes(&predictions).contains(&"returns"));
}

#[test]
fn forgetting_drops_the_objects_but_keeps_the_history() {
    let mut model = loaded();
    model.forget();
    assert!(model.object("sales").is_none());
    assert_eq!(model.history().count(), 2);
    let predictions = model.predict(Table::builtin(), &Learned::new(), 30);
    assert!(
        predictions.iter().all(|p| p.source != Source::Namespace),
        "no inspections of objects the restored namespace may not hold: {:?}",
        codes(&predictions)
    );
}

#[test]
fn a_reduction_is_followed_by_what_followed_any_reduction() {
    let mut model = loaded();
    model.observe("sales.price.max()", &facts(&[], vec![]), true);
    let followers = |top: &[(&str, u32)]| Followers {
        total: top.iter().map(|(_, n)| n).sum(),
        distinct: top.len() as u32,
        top: top.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
    };
    let mut table = Table::default();
    table
        .chain
        .insert("-1:*".to_string(), followers(&[(".head()", 5)]));
    let guessed = |table: &Table| {
        let predictions = model.predict(table, &Learned::new(), 30);
        codes(&predictions).contains(&"sales.price.median()")
    };
    assert!(!guessed(&table), "no reduction was ever seen to follow one");
    // Nothing is known to follow `.max()` itself, but other calls without arguments (its
    // shape, `._()`) were followed by `.median()`.
    table
        .chain
        .insert("-1~._()".to_string(), followers(&[(".median()", 3)]));
    assert!(guessed(&table));
}

#[test]
fn the_ranker_puts_the_frame_just_read_before_the_one_looked_at_earlier() {
    let mut model = loaded();
    model.observe("sales.head()", &facts(&[], vec![]), true);
    model.observe("sales.shape", &facts(&[], vec![]), true);
    read_returns(&mut model);
    let table = Table::builtin();
    assert!(table.ranker.is_some(), "the committed table has a ranker");
    let predictions = model.predict(table, &Learned::new(), 30);
    let top = codes(&predictions);
    assert!(top[0].starts_with("returns"), "{top:?}");
    // Summed, the sources put `sales.head()` fifth (run before, unchanged since); the
    // ranker puts the new frame's usual first inspections before it.
    let new_ones = top.iter().take_while(|c| c.starts_with("returns")).count();
    assert!(new_ones >= 6, "the frame just read comes first: {top:?}");
}

#[test]
fn what_changes_an_object_in_place_is_never_offered() {
    let mut model = loaded();
    let drop = "sales.drop(columns='units', inplace=True)";
    model.observe(drop, &facts(&["sales"], vec![sales()]), true);
    // The table says the cell is followed by itself and by a variant of it, and what
    // follows any cell may be such a call too.
    let mut table = Table::default();
    let inplace = Followers {
        total: 10,
        distinct: 3,
        top: vec![
            (".drop(columns=$c0,inplace=True)".to_string(), 4),
            (".dropna(inplace=True)".to_string(), 3),
            (".shape".to_string(), 3),
        ],
    };
    table.chain.insert("-0:*".to_string(), inplace.clone());
    table.chain.insert("-1:*".to_string(), inplace);
    let predictions = model.predict(&table, &Learned::new(), 200);
    let offered = codes(&predictions);
    assert!(offered.contains(&"sales.shape"), "{offered:?}");
    assert!(
        offered.iter().all(|code| !code.contains("inplace")),
        "the worker never serves these: {offered:?}"
    );
}
