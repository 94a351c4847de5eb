//! The session's last cells again with one slot refilled: the same inspection of the next
//! column (`df['a'].nunique()` then `df['b'].nunique()`), of another object of the same
//! kind that has the columns it reads (`len(week1)` then `len(week2)`), or with other literals
//! of the data (`df[df.sex == 'M']` then `df[df.sex == 'F']`).
//!
//! Part of the history source (`history.rs` adds these guesses to its own); each way of
//! varying has its own rate, counted on the corpus like the history's.

use super::history::{GuessKind, HistoryGuess};
use super::model::{has_few_values, Observed, SessionModel};
use super::normal::render;
use super::template::{instantiate_tokens, Filling};

/// Columns tried for one column slot, and objects for one variable.
const COLUMNS: usize = 8;
const OBJECTS: usize = 3;
/// Other fillings of a cell's literal slots tried.
const LITERALS: usize = 3;

impl SessionModel {
    /// The last few single-expression cells, each with one column or one object changed.
    pub(super) fn varied_guesses(&self) -> Vec<HistoryGuess> {
        let mut out = Vec::new();
        for (age, past) in self.recent_inspections() {
            out.extend(self.other_columns(past, age));
            out.extend(self.other_objects(past, age));
            out.extend(self.other_literals(past, age));
        }
        out
    }

    /// `past` with its literals of the data (index labels, column values) replaced by others
    /// of the same object or column.
    fn other_literals(&self, past: &Observed, age: usize) -> Vec<HistoryGuess> {
        if past.template.literals.is_empty() {
            return Vec::new();
        }
        let filling = Filling {
            vars: &past.template.vars,
            cols: &past.template.cols,
            ..Filling::default()
        };
        let Some(tokens) = instantiate_tokens(&past.template.key, &filling) else {
            return Vec::new();
        };
        let cost_ms = self.default_cost(&past.template.vars);
        self.fill_literals(tokens)
            .into_iter()
            .map(|(tokens, _)| render(&tokens))
            .filter(|code| past.normal.as_ref() != Some(code))
            .take(LITERALS)
            .map(|code| HistoryGuess {
                code,
                template: past.template.key.clone(),
                cost_ms,
                kind: GuessKind::OtherLiteral,
                age,
                order: 0,
            })
            .collect()
    }

    /// `past` with one of its columns replaced by another of the same cardinality in its frame,
    /// in the order the session is likely to go through them.
    fn other_columns(&self, past: &Observed, age: usize) -> Vec<HistoryGuess> {
        let mut out = Vec::new();
        let Some(owner) = past.template.vars.first() else {
            return out;
        };
        let Some(object) = self.objects.get(owner) else {
            return out;
        };
        let rows = object.len;
        let few_values = |label: &str| {
            object
                .columns
                .iter()
                .find(|c| c.name == label)
                .map(|c| has_few_values(c, rows))
        };
        for (slot, label) in past.template.cols.iter().enumerate() {
            let Some(few) = few_values(label) else {
                continue;
            };
            let choices = self
                .ranked_columns(owner)
                .into_iter()
                .filter(|c| !past.template.cols.contains(&c.name))
                .filter(|c| has_few_values(c, rows) == few)
                .take(COLUMNS);
            for (order, column) in choices.enumerate() {
                let mut cols = past.template.cols.clone();
                cols[slot] = column.name.clone();
                let vars = &past.template.vars;
                let guess = self.refilled(past, vars, &cols, GuessKind::OtherColumn, age);
                out.extend(guess.map(|g| HistoryGuess { order, ..g }));
            }
        }
        out
    }

    /// `past`, a cell on one object, applied to other objects of the same kind that have its
    /// columns: first those bound after it, in order (`person.shape` then `survey.shape`
    /// after loading both), then the recent ones (newer ones are the history's own
    /// re-application).
    fn other_objects(&self, past: &Observed, age: usize) -> Vec<HistoryGuess> {
        let [name] = past.template.vars.as_slice() else {
            return Vec::new();
        };
        let kind = self.kind(name);
        let bound_after = self.bound_order.iter().skip_while(|o| *o != name).skip(1);
        let mut others: Vec<&String> = Vec::new();
        for other in bound_after.chain(&self.recency) {
            if other != name
                && !others.contains(&other)
                && self.kind(other) == kind
                && self.bound_at.get(other).is_none_or(|&at| at <= past.seq)
            {
                others.push(other);
            }
        }
        others
            .into_iter()
            .filter_map(|other| self.on_object(past, other, GuessKind::OtherObject, age))
            .take(OBJECTS)
            .enumerate()
            .map(|(order, g)| HistoryGuess { order, ..g })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use pyvisor_protocol::messages::{CellFacts, ObjectSummary};

    use super::super::scenarios::column;
    use super::*;

    fn frame(name: &str) -> ObjectSummary {
        let columns = vec![
            column("buying", "str", 4),
            column("maint", "str", 4),
            column("doors", "int64", 4),
            column("price", "float64", 900),
        ];
        super::super::scenarios::frame(name, columns)
    }

    fn run(model: &mut SessionModel, code: &str, binds: &[&str], objects: Vec<ObjectSummary>) {
        let facts = CellFacts {
            binds: binds.iter().map(|s| s.to_string()).collect(),
            objects,
            ..CellFacts::default()
        };
        model.observe(code, &facts, true);
    }

    fn guesses(model: &SessionModel, kind: GuessKind) -> Vec<String> {
        model
            .varied_guesses()
            .into_iter()
            .filter(|g| g.kind == kind)
            .map(|g| g.code)
            .collect()
    }

    /// A session that bound `cars` and then ran `cells` on it.
    fn cars_after(cells: &[&str]) -> SessionModel {
        let mut model = SessionModel::new();
        run(&mut model, "cars = load()", &["cars"], vec![frame("cars")]);
        for cell in cells {
            run(&mut model, cell, &[], vec![frame("cars")]);
        }
        model
    }

    #[test]
    fn the_last_cell_moves_on_to_the_next_columns() {
        let model = cars_after(&["cars['buying'].nunique()"]);
        let columns = guesses(&model, GuessKind::OtherColumn);
        // `doors` is a number with few values, like a category; `price` has hundreds: not
        // what a count of categories moves on to.
        assert_eq!(
            columns,
            ["cars['maint'].nunique()", "cars['doors'].nunique()"]
        );
    }

    #[test]
    fn the_last_cell_moves_on_to_other_objects_of_its_kind() {
        let mut model = SessionModel::new();
        run(&mut model, "a = load()", &["a"], vec![frame("a")]);
        run(&mut model, "b = load()", &["b"], vec![frame("b")]);
        run(&mut model, "n = 3", &["n"], vec![]);
        run(&mut model, "len(a)", &[], vec![frame("a")]);
        let objects = guesses(&model, GuessKind::OtherObject);
        assert_eq!(objects, ["len(b)"]);
    }

    #[test]
    fn objects_bound_after_the_one_inspected_come_first_in_their_order() {
        let mut model = SessionModel::new();
        let frames = || vec![frame("person"), frame("site"), frame("survey")];
        run(
            &mut model,
            "person, site, survey = load()",
            &["person", "site", "survey"],
            frames(),
        );
        run(
            &mut model,
            "m = site.merge(person)",
            &["m"],
            vec![frame("m"), frame("site")],
        );
        run(&mut model, "site.shape", &[], vec![frame("site")]);
        // Recency alone would give `m` first; the tables loaded together are walked in order.
        let objects = guesses(&model, GuessKind::OtherObject);
        assert_eq!(objects[0], "survey.shape", "{objects:?}");
        let orders: Vec<usize> = model
            .varied_guesses()
            .into_iter()
            .filter(|g| g.kind == GuessKind::OtherObject)
            .map(|g| g.order)
            .collect();
        assert_eq!(orders, (0..orders.len()).collect::<Vec<_>>());
    }

    #[test]
    fn columns_selected_together_are_still_to_be_inspected() {
        let model = cars_after(&[
            "cars[['buying', 'maint', 'doors']].head()",
            "cars['buying'].nunique()",
        ]);
        let columns = guesses(&model, GuessKind::OtherColumn);
        assert_eq!(columns[0], "cars['maint'].nunique()", "{columns:?}");
    }

    #[test]
    fn an_inspection_two_cells_back_moves_on_too() {
        let model = cars_after(&["cars['buying'].nunique()", "cars.shape"]);
        let columns = guesses(&model, GuessKind::OtherColumn);
        assert!(
            columns.contains(&"cars['maint'].nunique()".to_string()),
            "{columns:?}"
        );
    }
}
