//! Method chains: a single expression seen as an object and its trailers (`df[df.a > 3]`
//! `.sort_values('b')` `.head()`), so that what follows a cell can be learned as "keep its
//! first trailers, drop the last ones, add these": `df[df.a > 3]` then `df[df.a > 3].shape`,
//! `s.mean()` then `s.median()`, whatever the filter or the object. What follows dropping
//! trailers is learned at three levels: the trailers as written, their shape (every name and
//! literal generalised), and their number only.

use super::normal::render;
use super::syntax::is_keyword;
use super::template::{abstract_tokens, relative, Scope, Template};
use super::tokens::{Kind, Token};

/// A single expression as an object name and the trailers applied to it.
#[derive(Debug, Clone, PartialEq)]
pub struct Chain {
    /// The variable the chain starts at.
    pub root: String,
    /// `.name`, `.name(...)`, `[...]` or `(...)`, in order.
    pub trailers: Vec<Vec<Token>>,
}

/// Splits a single expression into a chain; `None` when it is not a variable followed by
/// trailers only (a binary operation, a call of a function, a literal).
pub fn split(tokens: &[Token], scope: &Scope) -> Option<Chain> {
    let (first, mut rest) = tokens.split_first()?;
    if first.kind != Kind::Name || !scope.vars.contains(&first.text) {
        return None;
    }
    let mut trailers = Vec::new();
    while let Some(head) = rest.first() {
        let len = if head.is_op(".") {
            match rest.get(1) {
                Some(name) if name.kind == Kind::Name => {
                    if rest.get(2).is_some_and(|t| t.is_op("(")) {
                        2 + group_len(&rest[2..])?
                    } else {
                        2
                    }
                }
                _ => return None,
            }
        } else if head.is_op("[") || head.is_op("(") {
            group_len(rest)?
        } else {
            return None;
        };
        trailers.push(rest[..len].to_vec());
        rest = &rest[len..];
    }
    Some(Chain {
        root: first.text.clone(),
        trailers,
    })
}

/// The length of the bracketed group at the start of `tokens`.
fn group_len(tokens: &[Token]) -> Option<usize> {
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate() {
        if token.kind != Kind::Op {
            continue;
        }
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

impl Chain {
    /// The root and the first `keep` trailers, as tokens.
    pub fn prefix(&self, keep: usize) -> Vec<Token> {
        let mut out = vec![Token {
            kind: Kind::Name,
            text: self.root.clone(),
            value: None,
        }];
        for trailer in self.trailers.iter().take(keep) {
            out.extend(trailer.iter().cloned());
        }
        out
    }

    /// Whether the root and first `keep` trailers end in an indexer or a shape (`df.loc`,
    /// `s.iloc`, `df.shape`), which only a subscript can follow usefully.
    pub fn needs_subscript(&self, keep: usize) -> bool {
        let last = keep.checked_sub(1).and_then(|i| self.trailers.get(i));
        matches!(
            last.map(|t| t.iter().map(|t| t.text.as_str()).collect::<Vec<_>>())
                .as_deref(),
            Some([".", "loc" | "iloc" | "at" | "iat" | "shape"])
        )
    }

    /// The trailers from `from` on, as tokens.
    pub fn suffix(&self, from: usize) -> Vec<Token> {
        self.trailers.iter().skip(from).flatten().cloned().collect()
    }
}

/// The key of the context "the last cell, with its last `drop` trailers dropped": those
/// trailers with names and literals generalised, or `#` and the count when none.
pub fn drop_key(chain: &Chain, drop: usize, scope: &Scope) -> String {
    let from = chain.trailers.len() - drop;
    let dropped = abstract_suffix(chain, from, scope);
    format!("-{drop}:{}", dropped.context)
}

/// The key of the same context one level more general: the dropped trailers with every
/// name, string and number generalised (`.max()` and `.median()` both give `-1~._()`), so
/// that what follows one reduction is learned from what followed any other.
pub fn drop_key_shape(chain: &Chain, drop: usize) -> String {
    let from = chain.trailers.len() - drop;
    let shape: Vec<Token> = chain
        .suffix(from)
        .into_iter()
        .map(|t| match t.kind {
            Kind::Name if !is_keyword(&t.text) => general_token(Kind::Name, "_"),
            Kind::Str => general_token(Kind::Slot, "$s"),
            Kind::Number => general_token(Kind::Slot, "$n"),
            _ => t,
        })
        .collect();
    format!("-{drop}~{}", render(&shape))
}

fn general_token(kind: Kind, text: &str) -> Token {
    Token {
        kind,
        text: text.to_string(),
        value: None,
    }
}

/// The general key of dropping `drop` trailers.
pub fn drop_key_general(drop: usize) -> String {
    format!("-{drop}:*")
}

/// The trailers `next` adds after keeping the first `keep` of `prev`, relative to the root
/// (`$p0`) and the columns of the kept part (`$pc…`); `None` when `next` does not start with
/// that prefix or adds nothing.
pub fn added(prev: &Chain, keep: usize, next: &Chain, scope: &Scope) -> Option<String> {
    if next.root != prev.root
        || next.trailers.len() <= keep
        || prev.trailers.len() < keep
        || next.trailers[..keep] != prev.trailers[..keep]
    {
        return None;
    }
    let kept = abstract_tokens(&prev.prefix(keep), scope);
    let add = abstract_suffix(next, keep, scope);
    Some(relative(&add, std::slice::from_ref(&prev.root), &kept.cols))
}

/// The trailers of `chain` from `from` on, abstracted as they stand after its root, so that
/// a column read as an attribute of what is kept (`.SALARY.max()`) is a column slot; the
/// root itself is not written, and stands for `$0` where the trailers name it again.
fn abstract_suffix(chain: &Chain, from: usize, scope: &Scope) -> Template {
    let mut tokens = chain.prefix(0);
    tokens.extend(chain.suffix(from));
    let mut template = abstract_tokens(&tokens, scope);
    for text in [&mut template.key, &mut template.context] {
        if let Some(rest) = text.strip_prefix("$0") {
            *text = rest.to_string();
        }
    }
    template
}

/// The columns the kept part of a chain uses, for `$pc…` slots.
pub fn kept_columns(chain: &Chain, keep: usize, scope: &Scope) -> Vec<String> {
    abstract_tokens(&chain.prefix(keep), scope).cols
}

/// The kept part of a chain followed by an added suffix.
pub fn join(chain: &Chain, keep: usize, suffix: Vec<Token>) -> Vec<Token> {
    let mut out = chain.prefix(keep);
    out.extend(suffix);
    out
}

#[cfg(test)]
mod tests {
    use super::super::tokens::tokenize;
    use super::*;

    fn scope() -> Scope {
        Scope {
            vars: ["df".to_string()].into(),
            columns: ["a".to_string(), "b".to_string()].into(),
            ..Scope::default()
        }
    }

    fn chain(code: &str) -> Chain {
        split(&tokenize(code).expect("tokenizes"), &scope()).expect("a chain")
    }

    #[test]
    fn expressions_split_into_trailers() {
        let c = chain("df[df.a > 3].sort_values('b').head(5).shape");
        assert_eq!(c.root, "df");
        let parts: Vec<String> = c.trailers.iter().map(|t| render(t)).collect();
        assert_eq!(
            parts,
            ["[df.a>3]", ".sort_values('b')", ".head(5)", ".shape"]
        );
        assert!(!c.needs_subscript(0) && !c.needs_subscript(3) && c.needs_subscript(4));
        let c = chain("df.loc[df.a > 3].shape");
        assert!(c.needs_subscript(3) && !c.needs_subscript(2));
        assert!(chain("df.iloc").needs_subscript(1));
        assert!(split(&tokenize("df.a + 1").expect("tokenizes"), &scope()).is_none());
        assert!(split(&tokenize("len(df)").expect("tokenizes"), &scope()).is_none());
    }

    #[test]
    fn what_a_cell_adds_to_the_last_is_relative_to_it() {
        let s = scope();
        let prev = chain("df[df['a'] > 3]");
        let next = chain("df[df['a'] > 3].groupby('b').size()");
        assert_eq!(
            added(&prev, 1, &next, &s).as_deref(),
            Some(".groupby($c0).size()")
        );
        let prev = chain("df['a'].mean()");
        let next = chain("df['a'].median()");
        assert_eq!(added(&prev, 1, &next, &s).as_deref(), Some(".median()"));
        assert_eq!(drop_key(&prev, 1, &s), "-1:.mean()");
        assert_eq!(drop_key_shape(&prev, 1), drop_key_shape(&next, 1));
        assert_eq!(drop_key_shape(&chain("df.head(3)"), 1), "-1~._($n)");
        assert_eq!(added(&prev, 2, &next, &s), None);
        let suffix = tokenize(".median()").expect("tokenizes");
        assert_eq!(render(&join(&prev, 1, suffix)), "df['a'].median()");
    }

    #[test]
    fn a_column_read_as_an_attribute_of_the_kept_part_is_a_slot() {
        let s = scope();
        let prev = chain("df.a.max()");
        let next = chain("df.b.median()");
        // Keeping only the root, the next cell read another column: a column slot, not
        // the label `b` as written.
        assert_eq!(added(&prev, 0, &next, &s).as_deref(), Some(".$c0.median()"));
        assert_eq!(drop_key(&prev, 2, &s), "-2:.$c0.max()");
        let grouped = chain("df.groupby('a').b.sum()");
        assert_eq!(
            added(&chain("df.groupby('a')"), 1, &grouped, &s).as_deref(),
            Some(".$c0.sum()")
        );
        // The root named again in the trailers is the previous cell's root.
        let filtered = chain("df[df.a > 3]");
        assert_eq!(
            added(&prev, 0, &filtered, &s).as_deref(),
            Some("[$p0.$c0>3]")
        );
    }
}
