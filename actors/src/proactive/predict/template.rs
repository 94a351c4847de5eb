//! Templates: a cell's code with the session's variables as slots (`$0`, `$1`, ...) and the
//! string literals that are column labels as column slots (`$c0`, ...), so that what one
//! session did to `sales['region']` counts for what another does to `df['city']`.
//!
//! A template relative to a previous cell refers to that cell's slots as `$p0`, `$pc0`, and
//! keeps its own free slots numbered from 0.
//!
//! A string literal that is data rather than a name, a label of an index or a value of a
//! column in scope, becomes a literal slot `$v0` (`df.loc['Mike']` is `$0.loc[$v0]`,
//! `df[df.sex == 'M']` is `$0[$0.$c0==$v0]`). The template keeps the literals it was written
//! with ([`Template::literals`]); a template learned from another session is filled from the
//! facts of the object it is applied to (`literals.rs`).

use std::collections::HashSet;

use super::normal::render;
use super::syntax::is_keyword;
use super::tokens::{tokenize, tokenize_template, Kind, Token};

/// The names a cell is abstracted against.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Variables of the session (module aliases excluded).
    pub vars: HashSet<String>,
    /// String column labels of the frames in scope.
    pub columns: HashSet<String>,
    /// String index labels of the objects in scope.
    pub labels: HashSet<String>,
    /// Frequent string values of the columns in scope.
    pub values: HashSet<String>,
}

/// A cell abstracted: its template key and what fills each slot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Template {
    /// The normal form with slots, e.g. `$0[$c0].value_counts()`.
    pub key: String,
    /// The key with other strings and numbers generalised too (`$0.head($n)`): the cell as
    /// a context for what follows it.
    pub context: String,
    /// `vars[i]` fills `$i`.
    pub vars: Vec<String>,
    /// `cols[i]` fills `$ci`.
    pub cols: Vec<String>,
    /// `literals[i]` fills `$vi`.
    pub literals: Vec<String>,
}

/// The number of a literal slot token (`$v…`); `None` for any other token.
pub fn literal_slot(token: &Token) -> Option<usize> {
    if token.kind != Kind::Slot {
        return None;
    }
    token.text.strip_prefix("$v")?.parse().ok()
}

/// A slot as it appears in a template key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// Refers to the previous cell's slot (`$p…`).
    pub prev: bool,
    /// A column slot (`…c…`).
    pub column: bool,
    pub index: usize,
}

impl Slot {
    fn parse(text: &str) -> Option<Slot> {
        let rest = text.strip_prefix('$')?;
        let (prev, rest) = match rest.strip_prefix('p') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let (column, rest) = match rest.strip_prefix('c') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        Some(Slot {
            prev,
            column,
            index: rest.parse().ok()?,
        })
    }

    fn text(&self) -> String {
        format!(
            "${}{}{}",
            if self.prev { "p" } else { "" },
            if self.column { "c" } else { "" },
            self.index
        )
    }
}

/// Abstracts `code` against `scope`; `None` when it cannot be tokenized.
pub fn abstract_cell(code: &str, scope: &Scope) -> Option<Template> {
    tokenize(code).map(|tokens| abstract_tokens(&tokens, scope))
}

/// [`abstract_cell`] on tokens.
pub fn abstract_tokens(tokens: &[Token], scope: &Scope) -> Template {
    let mut vars: Vec<String> = Vec::new();
    let mut cols: Vec<String> = Vec::new();
    let mut literals: Vec<String> = Vec::new();
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len());
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate() {
        let after_dot = i > 0 && tokens[i - 1].is_op(".");
        let next = tokens.get(i + 1);
        let slot = match token.kind {
            Kind::Op => {
                match token.text.as_str() {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth = depth.saturating_sub(1),
                    _ => {}
                }
                None
            }
            Kind::Name if is_keyword(&token.text) => None,
            Kind::Name if !after_dot => {
                let keyword_argument = depth > 0 && next.is_some_and(|t| t.is_op("="));
                (!keyword_argument && scope.vars.contains(&token.text))
                    .then(|| (false, slot_index(&mut vars, &token.text)))
            }
            Kind::Name => {
                let called = next.is_some_and(|t| t.is_op("("));
                let on_slot = i > 1 && out[i - 2].kind == Kind::Slot;
                (on_slot && !called && scope.columns.contains(&token.text))
                    .then(|| (true, slot_index(&mut cols, &token.text)))
            }
            Kind::Str => {
                let value = token.value.as_ref();
                if let Some(v) = value.filter(|v| scope.columns.contains(*v)) {
                    Some((true, slot_index(&mut cols, v)))
                } else if let Some(v) =
                    value.filter(|v| scope.labels.contains(*v) || scope.values.contains(*v))
                {
                    let index = slot_index(&mut literals, v);
                    out.push(slot_like(&format!("$v{index}")));
                    continue;
                } else {
                    None
                }
            }
            _ => None,
        };
        out.push(match slot {
            Some((column, index)) => slot_token(Slot {
                prev: false,
                column,
                index,
            }),
            None => token.clone(),
        });
    }
    let general: Vec<Token> = out
        .iter()
        .map(|t| match t.kind {
            Kind::Str => slot_like("$s"),
            Kind::Slot if literal_slot(t).is_some() => slot_like("$s"),
            Kind::Number => slot_like("$n"),
            _ => t.clone(),
        })
        .collect();
    Template {
        key: render(&out),
        context: render(&general),
        vars,
        cols,
        literals,
    }
}

fn slot_index(list: &mut Vec<String>, name: &str) -> usize {
    match list.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            list.push(name.to_string());
            list.len() - 1
        }
    }
}

fn slot_token(slot: Slot) -> Token {
    slot_like(&slot.text())
}

fn slot_like(text: &str) -> Token {
    Token {
        kind: Kind::Slot,
        text: text.to_string(),
        value: None,
    }
}

/// The slots of a template key, in order of first appearance.
pub fn slots(key: &str) -> Vec<Slot> {
    let mut out: Vec<Slot> = Vec::new();
    for token in tokenize_template(key).unwrap_or_default().iter() {
        if let Some(slot) = Slot::parse(&token.text).filter(|_| token.kind == Kind::Slot) {
            if !out.contains(&slot) {
                out.push(slot);
            }
        }
    }
    out
}

/// Rewrites the variable and column slots of `key` through `map`, which is also told whether
/// the slot follows a `.`; `None` when a slot has no replacement. Literal slots stay.
fn rewrite(key: &str, mut map: impl FnMut(Slot, bool) -> Option<Token>) -> Option<Vec<Token>> {
    let tokens = tokenize_template(key)?;
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len());
    for token in tokens.iter() {
        let after_dot = out.last().is_some_and(|t| t.is_op("."));
        out.push(match token.kind {
            Kind::Slot if literal_slot(token).is_some() => token.clone(),
            Kind::Slot => map(Slot::parse(&token.text)?, after_dot)?,
            _ => token.clone(),
        });
    }
    Some(out)
}

/// `next` relative to the previous cell's filled slots: its variables and columns that
/// the previous cell used become `$p…`, the others free slots numbered anew.
pub fn relative(next: &Template, prev_vars: &[String], prev_cols: &[String]) -> String {
    let mut free_vars: Vec<usize> = Vec::new();
    let mut free_cols: Vec<usize> = Vec::new();
    let tokens = rewrite(&next.key, |slot, _| {
        let (names, prev_names, free) = if slot.column {
            (&next.cols, prev_cols, &mut free_cols)
        } else {
            (&next.vars, prev_vars, &mut free_vars)
        };
        let name = names.get(slot.index)?;
        let mapped = match prev_names.iter().position(|p| p == name) {
            Some(index) => Slot {
                prev: true,
                column: slot.column,
                index,
            },
            None => Slot {
                prev: false,
                column: slot.column,
                index: free
                    .iter()
                    .position(|&i| i == slot.index)
                    .unwrap_or_else(|| {
                        free.push(slot.index);
                        free.len() - 1
                    }),
            },
        };
        Some(slot_token(mapped))
    });
    tokens.map(|t| render(&t)).unwrap_or_default()
}

/// What fills a template's slots: the previous cell's and the free ones.
#[derive(Debug, Clone, Copy, Default)]
pub struct Filling<'a> {
    pub prev_vars: &'a [String],
    pub prev_cols: &'a [String],
    pub vars: &'a [String],
    pub cols: &'a [String],
    /// The literals of the template's own cell, when it is refilled.
    pub literals: &'a [String],
}

/// The code of `key` with its slots filled; `None` when a slot is missing or a label or
/// literal cannot be written where it stands.
pub fn instantiate(key: &str, filling: &Filling) -> Option<String> {
    instantiate_tokens(key, filling)
        .filter(|t| !t.iter().any(|t| literal_slot(t).is_some()))
        .map(|t| render(&t))
}

/// [`instantiate`], as tokens; literal slots that `filling` has no literal for stay.
pub fn instantiate_tokens(key: &str, filling: &Filling) -> Option<Vec<Token>> {
    let mut tokens = rewrite(key, |slot, after_dot| {
        let names = match (slot.prev, slot.column) {
            (true, true) => filling.prev_cols,
            (true, false) => filling.prev_vars,
            (false, true) => filling.cols,
            (false, false) => filling.vars,
        };
        let name = names.get(slot.index)?;
        if !slot.column || after_dot {
            let identifier = name.chars().all(|c| c == '_' || c.is_alphanumeric())
                && !name.starts_with(|c: char| c.is_ascii_digit());
            return identifier.then(|| Token {
                kind: Kind::Name,
                text: name.clone(),
                value: None,
            });
        }
        string_token(name)
    })?;
    for token in &mut tokens {
        if let Some(index) = literal_slot(token) {
            if let Some(literal) = filling.literals.get(index) {
                *token = string_token(literal)?;
            }
        }
    }
    Some(tokens)
}

/// `text` as a string literal; `None` when it needs escaping (it is left out rather than
/// written differently).
pub fn string_token(text: &str) -> Option<Token> {
    (!text.contains(['\\', '\'', '"', '\n', '\r'])).then(|| Token {
        kind: Kind::Str,
        text: format!("'{text}'"),
        value: Some(text.to_string()),
    })
}

/// The key with every attribute access of a column slot (`$0.$c0`) written as a subscript
/// (`$0[$c0]`): the form templates are counted in.
pub fn subscript_columns(key: &str) -> String {
    convert_column_access(key, true).unwrap_or_else(|| key.to_string())
}

/// The key with every subscript of a single column slot written as an attribute access;
/// `None` when it has none.
pub fn attribute_columns(key: &str) -> Option<String> {
    convert_column_access(key, false)
}

fn convert_column_access(key: &str, to_subscript: bool) -> Option<String> {
    let tokens = tokenize_template(key)?;
    let is_column =
        |t: &Token| t.kind == Kind::Slot && Slot::parse(&t.text).is_some_and(|s| s.column);
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len());
    let mut changed = false;
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        let after_object = out.last().is_some_and(|p: &Token| {
            matches!(p.kind, Kind::Slot | Kind::Name) || p.is_op(")") || p.is_op("]")
        });
        if to_subscript && t.is_op(".") && tokens.get(i + 1).is_some_and(is_column) {
            out.push(Token {
                kind: Kind::Op,
                text: "[".into(),
                value: None,
            });
            out.push(tokens[i + 1].clone());
            out.push(Token {
                kind: Kind::Op,
                text: "]".into(),
                value: None,
            });
            changed = true;
            i += 2;
            continue;
        }
        if !to_subscript
            && after_object
            && t.is_op("[")
            && tokens.get(i + 1).is_some_and(is_column)
            && tokens.get(i + 2).is_some_and(|c| c.is_op("]"))
        {
            out.push(Token {
                kind: Kind::Op,
                text: ".".into(),
                value: None,
            });
            out.push(tokens[i + 1].clone());
            changed = true;
            i += 3;
            continue;
        }
        out.push(t.clone());
        i += 1;
    }
    changed.then(|| render(&out))
}

/// Renumbers every slot of a (possibly relative) key in order of appearance, giving the
/// absolute template it stands for.
pub fn absolute(key: &str) -> String {
    let mut vars: Vec<Slot> = Vec::new();
    let mut cols: Vec<Slot> = Vec::new();
    rewrite(key, |slot, _| {
        let list = if slot.column { &mut cols } else { &mut vars };
        let index = list.iter().position(|s| *s == slot).unwrap_or_else(|| {
            list.push(slot);
            list.len() - 1
        });
        Some(slot_token(Slot {
            prev: false,
            column: slot.column,
            index,
        }))
    })
    .map(|t| render(&t))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::normal::normalise;
    use super::*;

    fn scope(vars: &[&str], columns: &[&str]) -> Scope {
        Scope {
            vars: vars.iter().map(|s| s.to_string()).collect(),
            columns: columns.iter().map(|s| s.to_string()).collect(),
            ..Scope::default()
        }
    }

    fn fill<'a>(t: &'a Template) -> Filling<'a> {
        Filling {
            vars: &t.vars,
            cols: &t.cols,
            literals: &t.literals,
            ..Filling::default()
        }
    }

    #[test]
    fn names_and_labels_become_slots_and_round_trip() {
        let s = scope(&["df", "sales", "n"], &["region", "city"]);
        for (code, key) in [
            ("df.head()", "$0.head()"),
            ("df[\"region\"].value_counts()", "$0[$c0].value_counts()"),
            (
                "sales.groupby('region')['city'].nunique()",
                "$0.groupby($c0)[$c1].nunique()",
            ),
            (
                "df.region.mean() + sales.region.sum()",
                "$0.$c0.mean()+$1.$c0.sum()",
            ),
            ("pd.merge(df, sales, on='city')", "pd.merge($0,$1,on=$c0)"),
            ("df.head(n)", "$0.head($1)"),
            (
                "df.sort_values(by='other', ascending=False).head(10)",
                "$0.sort_values(by='other',ascending=False).head(10)",
            ),
            ("df.n", "$0.n"),
            ("f(df=1)", "f(df=1)"),
        ] {
            let t = abstract_cell(code, &s).expect("tokenizes");
            assert_eq!(t.key, key, "{code}");
            let back = instantiate(&t.key, &fill(&t)).expect("fills");
            assert_eq!(Some(back), normalise(code), "{code}");
        }
        let t = abstract_cell("df.head(10)", &s).expect("tokenizes");
        assert_eq!(t.context, "$0.head($n)");
    }

    #[test]
    fn relative_templates_refer_to_the_previous_cell() {
        let s = scope(&["df", "top", "other"], &["a", "b"]);
        let prev = abstract_cell("top = df[df['a'] > 1]", &s).expect("tokenizes");
        let next =
            abstract_cell("top['b'].value_counts() + other['a'].sum()", &s).expect("tokenizes");
        let rel = relative(&next, &prev.vars, &prev.cols);
        assert_eq!(rel, "$p0[$c0].value_counts()+$0[$pc0].sum()");
        assert_eq!(absolute(&rel), "$0[$c0].value_counts()+$1[$c1].sum()");
        let code = instantiate(
            &rel,
            &Filling {
                prev_vars: &prev.vars,
                prev_cols: &prev.cols,
                vars: &["y".into()],
                cols: &["c".into()],
                literals: &[],
            },
        );
        assert_eq!(
            code.as_deref(),
            Some("top['c'].value_counts()+y['a'].sum()")
        );
        assert_eq!(
            slots(&rel).len(),
            4,
            "two previous and two free slots in {rel}"
        );
    }

    #[test]
    fn column_access_converts_between_forms() {
        assert_eq!(
            subscript_columns("$0.$c0.mean()+$1.$pc0"),
            "$0[$c0].mean()+$1[$pc0]"
        );
        assert_eq!(
            attribute_columns("$0[$c0].mean()+$0[[$c1]]").as_deref(),
            Some("$0.$c0.mean()+$0[[$c1]]")
        );
        assert_eq!(attribute_columns("$0.head()"), None);
    }

    #[test]
    fn labels_that_need_escapes_are_not_filled() {
        let filling = Filling {
            vars: &["df".into()],
            cols: &["it's".into()],
            ..Filling::default()
        };
        assert_eq!(instantiate("$0[$c0]", &filling), None);
        assert_eq!(instantiate("$0.$c0", &filling), None);
    }
}
