//! Literal slots filled from the data: a template learned with `$0.loc[$v0]` or
//! `$0[$0[$c0]==$v0]` becomes code for this session with a label of the index, or a frequent
//! value of the column, of the object it is applied to, as its latest facts summarise it.

use std::collections::HashMap;

use pyvisor_protocol::messages::{ColumnSummary, ObjectSummary};

use super::model::SessionModel;
use super::template::{literal_slot, string_token};
use super::tokens::{Kind, Token};

/// How much of a literal slot's fit goes to the data's first, second, ... literal (index
/// labels in order, column values the most frequent first); the others are not tried.
const LITERAL_SHARES: [f64; 3] = [0.5, 0.3, 0.2];

impl SessionModel {
    /// The ways to fill the literal slots left in `tokens` from the data they are applied
    /// to, each with its share; none when a slot has nothing to take.
    pub(super) fn fill_literals(&self, tokens: Vec<Token>) -> Vec<(Vec<Token>, f64)> {
        if !tokens.iter().any(|t| literal_slot(t).is_some()) {
            return vec![(tokens, 1.0)];
        }
        // Each filling so far: its tokens, its share, and the literal chosen for each slot.
        let mut fillings: Vec<(Vec<Token>, f64, HashMap<usize, Token>)> =
            vec![(Vec::with_capacity(tokens.len()), 1.0, HashMap::new())];
        let mut owner: Option<&ObjectSummary> = None;
        let mut column: Option<&ColumnSummary> = None;
        for (i, token) in tokens.iter().enumerate() {
            let after_dot = i > 0 && tokens[i - 1].is_op(".");
            let label = match token.kind {
                Kind::Name if !after_dot => {
                    if let Some(object) = self.objects.get(&token.text) {
                        (owner, column) = (Some(object), None);
                    }
                    None
                }
                Kind::Name => Some(&token.text),
                Kind::Str => token.value.as_ref(),
                _ => None,
            };
            if let Some(found) = label.and_then(|l| named_column(owner?, l)) {
                column = Some(found);
            }
            let Some(index) = literal_slot(token) else {
                for filling in &mut fillings {
                    filling.0.push(token.clone());
                }
                continue;
            };
            let compared = i > 0 && ["==", "!="].iter().any(|op| tokens[i - 1].is_op(op));
            let choices: Vec<(Token, f64)> = literals(owner, column, compared)
                .iter()
                .filter_map(|text| string_token(text))
                .zip(LITERAL_SHARES)
                .collect();
            let mut next = Vec::new();
            for (mut written, share, chosen) in fillings {
                if let Some(same) = chosen.get(&index) {
                    written.push(same.clone());
                    next.push((written, share, chosen));
                    continue;
                }
                for (choice, fit) in &choices {
                    let mut written = written.clone();
                    let mut chosen = chosen.clone();
                    written.push(choice.clone());
                    chosen.insert(index, choice.clone());
                    next.push((written, share * fit, chosen));
                }
            }
            fillings = next;
        }
        fillings
            .into_iter()
            .map(|(t, share, _)| (t, share))
            .collect()
    }
}

/// What may fill a literal slot: the values of the column named last since the object
/// (`df[df.sex == $v0]`), else for a Series compared with it its own values, else the labels
/// of the object's index (`df.loc[$v0]`, `counts[$v0]`), or a Series' values when it has none.
fn literals<'a>(
    owner: Option<&'a ObjectSummary>,
    column: Option<&'a ColumnSummary>,
    compared: bool,
) -> &'a [String] {
    if let Some(column) = column {
        return &column.values;
    }
    let Some(owner) = owner else {
        return &[];
    };
    let own_values = (owner.kind == "Series")
        .then(|| owner.columns.first())
        .flatten()
        .map_or(&[][..], |c| c.values.as_slice());
    if compared || owner.labels.is_empty() {
        own_values
    } else {
        &owner.labels
    }
}

/// The column of `object` whose label is `label` (a frame's, or a Series' own).
fn named_column<'a>(object: &'a ObjectSummary, label: &str) -> Option<&'a ColumnSummary> {
    object
        .columns
        .iter()
        .find(|c| c.label_is_str && c.name == label)
}

#[cfg(test)]
mod tests {
    use pyvisor_protocol::messages::CellFacts;

    use super::super::normal::render;
    use super::super::scenarios::{column, frame};
    use super::super::template::{instantiate_tokens, Filling};
    use super::*;

    /// A session holding `object`, just bound.
    fn holding(object: ObjectSummary) -> SessionModel {
        let mut model = SessionModel::new();
        let facts = CellFacts {
            binds: vec![object.name.clone()],
            objects: vec![object],
            ..CellFacts::default()
        };
        model.observe("x = load()", &facts, true);
        model
    }

    fn with_values(mut c: ColumnSummary, values: &[&str]) -> ColumnSummary {
        c.values = values.iter().map(|v| v.to_string()).collect();
        c
    }

    fn labelled(mut o: ObjectSummary, labels: &[&str]) -> ObjectSummary {
        o.index = Some("Index".to_string());
        o.labels = labels.iter().map(|v| v.to_string()).collect();
        o
    }

    /// `key` filled with `vars` and `cols`, then its literals from `model`'s data.
    fn filled(model: &SessionModel, key: &str, vars: &[&str], cols: &[&str]) -> Vec<(String, f64)> {
        let vars: Vec<String> = vars.iter().map(|v| v.to_string()).collect();
        let cols: Vec<String> = cols.iter().map(|v| v.to_string()).collect();
        let filling = Filling {
            vars: &vars,
            cols: &cols,
            ..Filling::default()
        };
        let tokens = instantiate_tokens(key, &filling).expect("fills");
        model
            .fill_literals(tokens)
            .into_iter()
            .map(|(t, share)| (render(&t), share))
            .collect()
    }

    #[test]
    fn literals_learned_in_one_session_are_filled_from_another_sessions_data() {
        let people = labelled(
            frame(
                "people",
                vec![with_values(column("sex", "object", 2), &["M", "F"])],
            ),
            &["Mike", "Ann"],
        );
        let learned_in = holding(people);
        let filter = learned_in
            .abstract_next("people[people.sex == 'F']")
            .expect("tokenizes");
        assert_eq!(filter.key, "$0[$0.$c0==$v0]");
        assert_eq!(filter.literals, ["F"]);
        let row = learned_in
            .abstract_next("people.loc['Mike']")
            .expect("tokenizes");
        assert_eq!(row.key, "$0.loc[$v0]");
        assert_eq!(row.context, "$0.loc[$s]");

        let crew = labelled(
            frame(
                "crew",
                vec![
                    with_values(
                        column("role", "object", 3),
                        &["pilot", "cook", "medic", "x"],
                    ),
                    column("age", "int64", 40),
                ],
            ),
            &["Zed"],
        );
        let applied_to = holding(crew);
        assert_eq!(
            filled(&applied_to, &filter.key, &["crew"], &["role"]),
            [
                ("crew[crew.role=='pilot']".to_string(), 0.5),
                ("crew[crew.role=='cook']".to_string(), 0.3),
                ("crew[crew.role=='medic']".to_string(), 0.2),
            ]
        );
        assert_eq!(
            filled(&applied_to, "$0[$0[$c0]==$v0]", &["crew"], &["role"])[0].0,
            "crew[crew['role']=='pilot']"
        );
        assert_eq!(
            filled(&applied_to, &row.key, &["crew"], &[]),
            [("crew.loc['Zed']".to_string(), 0.5)]
        );
    }

    #[test]
    fn a_literal_slot_without_data_to_take_writes_nothing() {
        let plain = holding(frame(
            "df",
            vec![
                column("age", "int64", 40),
                with_values(column("it", "object", 2), &["it's", "ok"]),
            ],
        ));
        assert!(filled(&plain, "$0.loc[$v0]", &["df"], &[]).is_empty());
        assert!(filled(&plain, "$0[$0.$c0==$v0]", &["df"], &["age"]).is_empty());
        assert!(filled(&plain, "$0==$v0", &["other"], &[]).is_empty());
        // A value that would need escaping is not written.
        assert_eq!(
            filled(&plain, "$0[$0.$c0==$v0]", &["df"], &["it"]),
            [("df[df.it=='ok']".to_string(), 0.5)]
        );
    }

    #[test]
    fn a_slot_written_twice_takes_one_literal_and_a_series_gives_its_values_or_labels() {
        let mut sex = frame(
            "sex",
            vec![with_values(column("sex", "object", 2), &["M", "F"])],
        );
        sex.kind = "Series".to_string();
        let model = holding(sex);
        assert_eq!(
            filled(&model, "($0==$v0).sum()+($0!=$v0).sum()", &["sex"], &[]),
            [
                ("(sex=='M').sum()+(sex!='M').sum()".to_string(), 0.5),
                ("(sex=='F').sum()+(sex!='F').sum()".to_string(), 0.3),
            ]
        );
        assert_eq!(
            filled(&model, "$0.head()", &["sex"], &[]),
            [("sex.head()".to_string(), 1.0)]
        );
        let mut counts = frame("counts", vec![with_values(column("n", "int64", 2), &[])]);
        counts.kind = "Series".to_string();
        let model = holding(labelled(counts, &["M", "F"]));
        assert_eq!(
            filled(&model, "$0[$v0]", &["counts"], &[])[1].0,
            "counts['F']"
        );
    }
}
