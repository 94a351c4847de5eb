//! The last few cells edited: one of their calls with an argument dropped, or with a keyword that
//! sessions pass to that callee added or given another value (`df.sort_values('a')` then
//! `df.sort_values('a', ascending=False)`), or one of its members swapped for one that
//! sessions use in its place (`s.isnull().sum()` then `s.notnull().sum()`).
//!
//! The vocabulary ([`Edits`]: keywords with a literal value by callee, members by member) is
//! counted on the corpus by `learn.rs`, and an entry is kept only when sessions of two
//! repositories at least used it, so that it is the library's vocabulary and not one
//! session's. Besides the members a later cell used in another's place, members are *alike*
//! when the corpus wrote both in the same surroundings in several places (`$0.$c0.max()` and
//! `$0.$c0.median()`, `$0[$c0].max()` and `$0[$c0].median()`), whether or not one session
//! swapped them: `df.SALARY.max()` then `df.SALARY.median()`. Values that are data of the
//! session (column labels, index labels, column values) are never counted. Part of the
//! history source, each way of editing with its own learned rate.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::history::{GuessKind, HistoryGuess};
use super::model::{Observed, SessionModel};
use super::normal::{render, single_expression};
use super::syntax::{is_keyword, statements};
use super::template::{abstract_tokens, Scope};
use super::tokens::{tokenize, Kind, Token};

/// Keywords tried per call, and members per member.
const KEYWORDS: usize = 4;
const SIBLINGS: usize = 5;
/// Entries kept per callee or member in the table.
const KEPT: usize = 8;
/// Repositories whose sessions must have used an entry for it to be kept.
const MIN_REPOSITORIES: usize = 2;
/// How many cells back a member swapped for another is looked for when counting.
const WINDOW: usize = 5;
/// Alike members tried per member, beyond the siblings.
const ALIKE: usize = 6;
/// Surroundings two members must share to be alike.
const MIN_SHARED: u32 = 2;
/// Stands for the member taken out of a statement to give its surroundings.
const HOLE: &str = "_member_";

/// The learned vocabulary of edits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Edits {
    /// Callee name (`sort_values`, `read_csv`) to the `keyword=value` arguments passed to it,
    /// with how often, the most frequent first.
    pub keywords: BTreeMap<String, Vec<(String, u32)>>,
    /// Member name (`isnull`) to the members a later cell used in its place, the rest of the
    /// statement unchanged (`notnull`), with how often, the most frequent first.
    pub siblings: BTreeMap<String, Vec<(String, u32)>>,
    /// Member name to the members written in the same surroundings (the statement's template
    /// with the member taken out), with how many surroundings they share, the most first.
    #[serde(default)]
    pub alike: BTreeMap<String, Vec<(String, u32)>>,
}

/// Counts of the vocabulary, with the repositories each entry was seen in.
#[derive(Debug, Default)]
pub(super) struct EditCounts {
    keywords: HashMap<(String, String), Seen>,
    siblings: HashMap<(String, String), Seen>,
    /// (surroundings, member): a member as written, with its statement's template around it.
    members: HashMap<(String, String), Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    count: u32,
    repositories: HashSet<String>,
}

impl Seen {
    fn add(&mut self, repository: &str) {
        self.count += 1;
        self.repositories.insert(repository.to_string());
    }
}

impl EditCounts {
    /// Counts one cell of a session of `repository`, after the cells `recent` (the most
    /// recent last), with the session's names in `scope`.
    pub(super) fn add_cell(
        &mut self,
        repository: &str,
        tokens: &[Token],
        recent: &[Vec<Token>],
        scope: &Scope,
    ) {
        for call in calls(tokens) {
            for arg in &call.args {
                if let Some(keyword) = literal_keyword(&tokens[arg.0..arg.1], scope) {
                    let key = (call.callee.clone(), keyword);
                    self.keywords.entry(key).or_default().add(repository);
                }
            }
        }
        let earlier: Vec<&[Token]> = recent
            .iter()
            .rev()
            .take(WINDOW)
            .flat_map(|t| statements(t))
            .collect();
        for statement in statements(tokens) {
            for (at, member) in members(statement, scope) {
                let mut holed = statement.to_vec();
                holed[at].text = HOLE.to_string();
                let surroundings = abstract_tokens(&holed, scope).context;
                let key = (surroundings, member.to_string());
                self.members.entry(key).or_default().add(repository);
            }
            for before in &earlier {
                if let Some((from, to)) = swapped_member(before, statement, scope) {
                    for pair in [(from.clone(), to.clone()), (to, from)] {
                        self.siblings.entry(pair).or_default().add(repository);
                    }
                }
            }
        }
    }

    /// The vocabulary of entries seen in enough repositories other than `without`.
    pub(super) fn build(&self, without: Option<&str>) -> Edits {
        Edits {
            keywords: kept(&self.keywords, without),
            siblings: kept(&self.siblings, without),
            alike: alike(&self.members, without),
        }
    }
}

/// Members to the members that share at least [`MIN_SHARED`] surroundings with them, in
/// sessions of repositories other than `without`.
fn alike(
    members: &HashMap<(String, String), Seen>,
    without: Option<&str>,
) -> BTreeMap<String, Vec<(String, u32)>> {
    let mut by_surroundings: HashMap<&str, Vec<&str>> = HashMap::new();
    for ((surroundings, member), seen) in members {
        if seen
            .repositories
            .iter()
            .any(|r| Some(r.as_str()) != without)
        {
            by_surroundings
                .entry(surroundings)
                .or_default()
                .push(member);
        }
    }
    let mut shared: HashMap<(&str, &str), u32> = HashMap::new();
    for written in by_surroundings.values() {
        for a in written {
            for b in written.iter().filter(|b| *b != a) {
                *shared.entry((a, b)).or_default() += 1;
            }
        }
    }
    let mut out: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
    for ((a, b), n) in shared {
        if n >= MIN_SHARED {
            out.entry(a.to_string())
                .or_default()
                .push((b.to_string(), n));
        }
    }
    for entries in out.values_mut() {
        entries.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        entries.truncate(KEPT);
    }
    out
}

/// The members of `statement` (a name after a `.`) that are neither a column label nor a
/// variable, with their positions.
fn members<'a>(statement: &'a [Token], scope: &Scope) -> Vec<(usize, &'a str)> {
    (1..statement.len())
        .filter(|&at| statement[at - 1].is_op(".") && is_member(&statement[at], scope))
        .map(|at| (at, statement[at].text.as_str()))
        .collect()
}

fn is_member(token: &Token, scope: &Scope) -> bool {
    token.kind == Kind::Name
        && !is_keyword(&token.text)
        && !scope.columns.contains(&token.text)
        && !scope.vars.contains(&token.text)
}

fn kept(
    counts: &HashMap<(String, String), Seen>,
    without: Option<&str>,
) -> BTreeMap<String, Vec<(String, u32)>> {
    let mut out: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
    for ((key, entry), seen) in counts {
        let repositories = seen
            .repositories
            .iter()
            .filter(|r| Some(r.as_str()) != without)
            .count();
        if repositories >= MIN_REPOSITORIES {
            out.entry(key.clone())
                .or_default()
                .push((entry.clone(), seen.count));
        }
    }
    for entries in out.values_mut() {
        entries.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        entries.truncate(KEPT);
    }
    out
}

/// One call in a token stream: its callee's name, and the token ranges of its arguments.
struct Call {
    callee: String,
    /// Index of the `)` closing it.
    close: usize,
    args: Vec<(usize, usize)>,
}

/// The calls of a name or member (`f(...)`, `x.f(...)`), in order of their `(`.
fn calls(tokens: &[Token]) -> Vec<Call> {
    let mut out = Vec::new();
    for (open, token) in tokens.iter().enumerate().skip(1) {
        let callee = &tokens[open - 1];
        if !token.is_op("(") || callee.kind != Kind::Name || is_keyword(&callee.text) {
            continue;
        }
        let mut depth = 0usize;
        let mut args = Vec::new();
        let mut start = open + 1;
        for (i, t) in tokens.iter().enumerate().skip(open) {
            if t.kind != Kind::Op {
                continue;
            }
            match t.text.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => {
                    depth -= 1;
                    if depth == 0 {
                        if i > start {
                            args.push((start, i));
                        }
                        out.push(Call {
                            callee: callee.text.clone(),
                            close: i,
                            args,
                        });
                        break;
                    }
                }
                "," if depth == 1 => {
                    args.push((start, i));
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    out
}

/// `k=value` as written, when `arg` is a keyword argument whose value is a literal that is not
/// data of the session (a number, `True`, `False`, `None`, or a string that names nothing in
/// `scope`); never `inplace`.
fn literal_keyword(arg: &[Token], scope: &Scope) -> Option<String> {
    let [name, eq, value @ ..] = arg else {
        return None;
    };
    if name.kind != Kind::Name || !eq.is_op("=") || name.text == "inplace" {
        return None;
    }
    let literal = match value {
        [t] if t.kind == Kind::Number => true,
        [minus, t] if minus.is_op("-") && t.kind == Kind::Number => true,
        [t] if t.kind == Kind::Name => matches!(t.text.as_str(), "True" | "False" | "None"),
        [t] if t.kind == Kind::Str => t.value.as_ref().is_some_and(|v| {
            !scope.columns.contains(v) && !scope.labels.contains(v) && !scope.values.contains(v)
        }),
        _ => false,
    };
    literal.then(|| render(arg))
}

/// The member `before` has where `after` has another, when that is their only difference
/// and neither is a column label or a variable.
fn swapped_member(before: &[Token], after: &[Token], scope: &Scope) -> Option<(String, String)> {
    if before.len() != after.len() {
        return None;
    }
    let mut differing = before
        .iter()
        .zip(after)
        .enumerate()
        .filter(|(_, (a, b))| a != b);
    let (at, (from, to)) = differing.next()?;
    if differing.next().is_some() || at == 0 || !before[at - 1].is_op(".") {
        return None;
    }
    (is_member(from, scope) && is_member(to, scope)).then(|| (from.text.clone(), to.text.clone()))
}

impl SessionModel {
    /// The last few cells that were single expressions and ran, each with one argument or
    /// one member edited.
    pub(super) fn edited_guesses(&self, edits: &Edits) -> Vec<HistoryGuess> {
        let scope = self.scope();
        let mut out: Vec<HistoryGuess> = Vec::new();
        for (age, past) in self.recent_inspections() {
            for (tokens, kind, order) in edited(past, edits, &scope) {
                let code = render(&tokens);
                if !single_expression(&tokens)
                    || past.normal.as_ref() == Some(&code)
                    || out.iter().any(|g| g.code == code)
                {
                    continue;
                }
                let template = abstract_tokens(&tokens, &scope);
                out.push(HistoryGuess {
                    code,
                    cost_ms: self.default_cost(&template.vars),
                    template: template.key,
                    kind,
                    age,
                    order,
                });
            }
        }
        out
    }
}

/// The cell `past` with one argument or one member edited, each with the way it was edited.
fn edited(past: &Observed, edits: &Edits, scope: &Scope) -> Vec<(Vec<Token>, GuessKind, usize)> {
    let Some(tokens) = tokenize(&past.code) else {
        return Vec::new();
    };
    let mut edited: Vec<(Vec<Token>, GuessKind, usize)> = Vec::new();
    for call in calls(&tokens) {
        for arg in 0..call.args.len() {
            edited.push((drop_argument(&tokens, &call, arg), GuessKind::Argument, 0));
        }
        let learned = edits.keywords.get(&call.callee).into_iter().flatten();
        for (keyword, _) in learned.take(KEYWORDS) {
            if let Some(t) = with_keyword(&tokens, &call, keyword) {
                edited.push((t, GuessKind::Argument, 0));
            }
        }
    }
    for (at, member) in members(&tokens, scope) {
        let swap = |other: &str| {
            let mut t = tokens.clone();
            t[at].text = other.to_string();
            t
        };
        let siblings: Vec<&str> = (edits.siblings.get(member).into_iter().flatten())
            .take(SIBLINGS)
            .map(|(s, _)| s.as_str())
            .collect();
        for (order, sibling) in siblings.iter().enumerate() {
            edited.push((swap(sibling), GuessKind::Swapped, order));
        }
        let alike = edits.alike.get(member).into_iter().flatten();
        let alike = alike.filter(|(o, _)| !siblings.contains(&o.as_str()));
        for (order, (other, _)) in alike.take(ALIKE).enumerate() {
            edited.push((swap(other), GuessKind::Alike, order));
        }
    }
    edited
}

/// `tokens` without the `arg`-th argument of `call` (and the comma that went with it).
fn drop_argument(tokens: &[Token], call: &Call, arg: usize) -> Vec<Token> {
    let (start, end) = call.args[arg];
    let (start, end) = if arg + 1 < call.args.len() {
        (start, call.args[arg + 1].0)
    } else if arg > 0 {
        (call.args[arg - 1].1, end)
    } else {
        (start, end)
    };
    let mut out = tokens[..start].to_vec();
    out.extend_from_slice(&tokens[end..]);
    out
}

/// `tokens` with `keyword` (`k=value`) given to `call`: its value replaced when `call` passes
/// `k` already, else added last; `None` when it passes `k` with that value.
fn with_keyword(tokens: &[Token], call: &Call, keyword: &str) -> Option<Vec<Token>> {
    let new = tokenize(keyword)?;
    let name = new.first()?;
    let mut out = tokens.to_vec();
    let passed = call.args.iter().find(|(start, _)| {
        tokens[*start] == *name && tokens.get(start + 1).is_some_and(|t| t.is_op("="))
    });
    match passed {
        Some(&(start, end)) if tokens[start..end] == new[..] => return None,
        Some(&(start, end)) => {
            out.splice(start..end, new);
        }
        None => {
            let mut added = Vec::new();
            if !call.args.is_empty() {
                added.push(Token {
                    kind: Kind::Op,
                    text: ",".to_string(),
                    value: None,
                });
            }
            added.extend(new);
            out.splice(call.close..call.close, added);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use pyvisor_protocol::messages::CellFacts;

    use super::super::scenarios::{column, frame};
    use super::*;

    /// A session holding the frame `df` (columns `price` and `city`) that ran `code` last.
    fn after(code: &str, ok: bool) -> SessionModel {
        let df = frame(
            "df",
            vec![column("price", "float64", 700), column("city", "str", 5)],
        );
        let mut model = SessionModel::new();
        let facts = CellFacts {
            binds: vec!["df".to_string()],
            objects: vec![df.clone()],
            ..CellFacts::default()
        };
        model.observe("df = load()", &facts, true);
        let facts = CellFacts {
            objects: vec![df],
            ..CellFacts::default()
        };
        model.observe(code, &facts, ok);
        model
    }

    fn vocabulary() -> Edits {
        let entries = |key: &str, values: &[&str]| {
            let values = values.iter().map(|v| (v.to_string(), 3)).collect();
            (key.to_string(), values)
        };
        Edits {
            keywords: [entries(
                "sort_values",
                &["ascending=False", "na_position='first'"],
            )]
            .into(),
            siblings: [entries("isnull", &["notnull"]), entries("price", &["city"])].into(),
            alike: [
                entries("isnull", &["notnull", "isna"]),
                entries("max", &["median"]),
            ]
            .into(),
        }
    }

    fn guesses(model: &SessionModel, kind: GuessKind) -> Vec<String> {
        model
            .edited_guesses(&vocabulary())
            .into_iter()
            .filter(|g| g.kind == kind)
            .map(|g| g.code)
            .collect()
    }

    #[test]
    fn a_call_gets_a_learned_keyword_or_loses_an_argument() {
        let model = after("df.sort_values('price')", true);
        assert_eq!(
            guesses(&model, GuessKind::Argument),
            [
                "df.sort_values()",
                "df.sort_values('price',ascending=False)",
                "df.sort_values('price',na_position='first')",
            ]
        );
        let model = after("df.sort_values('price', ascending=False).head()", true);
        let edited = guesses(&model, GuessKind::Argument);
        assert!(edited.contains(&"df.sort_values('price').head()".to_string()));
        // The keyword it passes with that value is not offered again; another value is.
        assert!(!edited.iter().any(|g| g.contains("False,ascending")));
        let guess = &model.edited_guesses(&vocabulary())[0];
        assert_eq!(guess.template, "$0.sort_values(ascending=False).head()");
    }

    #[test]
    fn a_member_is_swapped_for_a_sibling_but_not_a_column() {
        let model = after("df.isnull().sum()", true);
        assert_eq!(guesses(&model, GuessKind::Swapped), ["df.notnull().sum()"]);
        // `price` is a column of `df`: the vocabulary does not rename the session's data.
        let model = after("df.price.mean()", true);
        assert!(guesses(&model, GuessKind::Swapped).is_empty());
    }

    #[test]
    fn a_member_is_swapped_for_one_written_alike() {
        let model = after("df.price.max()", true);
        assert_eq!(guesses(&model, GuessKind::Alike), ["df.price.median()"]);
        // A sibling already tried is not tried again as alike.
        let model = after("df.isnull().sum()", true);
        assert_eq!(guesses(&model, GuessKind::Alike), ["df.isna().sum()"]);
    }

    #[test]
    fn members_are_alike_when_written_in_two_of_the_same_surroundings() {
        let scope = Scope {
            vars: ["df".to_string(), "s".to_string()].into(),
            columns: ["price".to_string()].into(),
            ..Scope::default()
        };
        let tokens = |code: &str| tokenize(code).expect("tokenizes");
        let mut counts = EditCounts::default();
        for (repository, code) in [
            ("a", "df.price.max()"),
            ("b", "df['price'].max()"),
            ("b", "df.price.median()"),
            ("c", "df['price'].median()"),
            ("c", "s.max()"),
            ("a", "s.shape"),
        ] {
            counts.add_cell(repository, &tokens(code), &[], &scope);
        }
        let edits = counts.build(None);
        assert_eq!(edits.alike["max"], [("median".to_string(), 2)]);
        assert_eq!(edits.alike["median"], [("max".to_string(), 2)]);
        // `shape` shares only `s._` with nothing: no entry.
        assert!(!edits.alike.contains_key("shape"));
        // Without repository c, `$0[$c0].median()` is gone and one surrounding is left.
        assert!(counts.build(Some("c")).alike.is_empty());
    }

    #[test]
    fn the_cells_before_the_last_are_edited_too() {
        let mut model = after("df.isnull().head()", true);
        model.observe("df.shape", &CellFacts::default(), true);
        let swapped: Vec<HistoryGuess> = model
            .edited_guesses(&vocabulary())
            .into_iter()
            .filter(|g| g.kind == GuessKind::Swapped)
            .collect();
        assert_eq!(swapped[0].code, "df.notnull().head()");
        assert_eq!(swapped[0].age, 1);
    }

    #[test]
    fn nothing_is_edited_after_an_error_or_a_statement() {
        assert!(after("df.isnull().sum()", false)
            .edited_guesses(&vocabulary())
            .is_empty());
        assert!(after("x = df.sort_values('price')", true)
            .edited_guesses(&vocabulary())
            .is_empty());
    }

    #[test]
    fn the_vocabulary_keeps_what_two_repositories_used_and_no_data() {
        let scope = Scope {
            vars: ["df".to_string()].into(),
            columns: ["price".to_string()].into(),
            ..Scope::default()
        };
        let tokens = |code: &str| tokenize(code).expect("tokenizes");
        let mut counts = EditCounts::default();
        let earlier = [tokens("df.isnull().sum()")];
        for repository in ["a", "b"] {
            counts.add_cell(
                repository,
                &tokens("df.merge(df, how='left', on='price', inplace=True)"),
                &[],
                &scope,
            );
            counts.add_cell(repository, &tokens("df.notnull().sum()"), &earlier, &scope);
        }
        counts.add_cell("a", &tokens("df.head(n=3)"), &[], &scope);
        let edits = counts.build(None);
        // `on='price'` names a column and `inplace` is never offered; `n=3` was seen in one
        // repository only.
        assert_eq!(
            edits.keywords,
            [("merge".to_string(), vec![("how='left'".to_string(), 2)])].into()
        );
        assert_eq!(edits.siblings["isnull"], [("notnull".to_string(), 2)]);
        assert_eq!(edits.siblings["notnull"], [("isnull".to_string(), 2)]);
        // Without one of the two repositories, nothing is left.
        assert_eq!(counts.build(Some("a")), Edits::default());
    }
}
