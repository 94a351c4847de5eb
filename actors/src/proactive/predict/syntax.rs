//! What a cell's tokens say about names, without running it: the statements it holds, the
//! names it imports, assigns or mutates, and the string literals it uses as column labels.
//!
//! Used to keep module aliases out of templates, and to stand in for the worker's facts when
//! learning from code alone.

use super::tokens::{Kind, Token};

/// The simple statements of a cell, split at top-level line ends, `;` and indentation.
pub fn statements(tokens: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate() {
        let split = match token.kind {
            Kind::Newline | Kind::Indent | Kind::Dedent => true,
            Kind::Op => {
                match token.text.as_str() {
                    "(" | "[" | "{" => depth += 1,
                    ")" | "]" | "}" => depth = depth.saturating_sub(1),
                    _ => {}
                }
                depth == 0 && token.text == ";"
            }
            _ => false,
        };
        if split {
            if i > start {
                out.push(&tokens[start..i]);
            }
            start = i + 1;
        }
    }
    if tokens.len() > start {
        out.push(&tokens[start..]);
    }
    out
}

/// Names bound by the cell's import statements (`import a.b` binds `a`).
pub fn imported(tokens: &[Token]) -> Vec<String> {
    let mut out = Vec::new();
    for statement in statements(tokens) {
        let from = statement.first().is_some_and(|t| t.is_name("from"));
        let Some(start) = statement.iter().position(|t| t.is_name("import")) else {
            continue;
        };
        if !from && start != 0 {
            continue;
        }
        let names: Vec<&Token> = statement[start + 1..]
            .iter()
            .filter(|t| !t.is_op("(") && !t.is_op(")"))
            .collect();
        for item in names.split(|t| t.is_op(",")) {
            match item {
                [.., as_kw, alias] if as_kw.is_name("as") => out.push(alias.text.clone()),
                [first, ..] if first.kind == Kind::Name && first.text != "*" => {
                    out.push(first.text.clone())
                }
                _ => {}
            }
        }
    }
    out
}

/// Names the cell binds at the top level: assignment targets, `for` targets, `with ... as`,
/// `def` and `class`; not imports.
pub fn assigned(tokens: &[Token]) -> Vec<String> {
    let mut out = Vec::new();
    for statement in statements(tokens) {
        for target in targets(statement) {
            for name in bare_names(target) {
                if !out.contains(&name) {
                    out.push(name);
                }
            }
        }
        if let [kw, name, ..] = statement {
            if (kw.is_name("def") || kw.is_name("class")) && name.kind == Kind::Name {
                out.push(name.text.clone());
            }
        }
        if statement.first().is_some_and(|t| t.is_name("for")) {
            let end = statement
                .iter()
                .position(|t| t.is_name("in"))
                .unwrap_or(statement.len());
            out.extend(bare_names(&statement[1..end]));
        }
        if statement.first().is_some_and(|t| t.is_name("with")) {
            for pair in statement.windows(2) {
                if pair[0].is_name("as") && pair[1].kind == Kind::Name {
                    out.push(pair[1].text.clone());
                }
            }
        }
    }
    out
}

/// Names whose objects the cell changes in place: `x[...] = `, `x.a = `, and calls with
/// `inplace=True` on a chain that starts at `x`.
pub fn mutated(tokens: &[Token]) -> Vec<String> {
    let mut out = Vec::new();
    for statement in statements(tokens) {
        for target in targets(statement) {
            if let [base, next, ..] = target {
                if base.kind == Kind::Name && (next.is_op("[") || next.is_op(".")) {
                    out.push(base.text.clone());
                }
            }
        }
        let inplace = statement
            .windows(3)
            .any(|w| w[0].is_name("inplace") && w[1].is_op("=") && w[2].is_name("True"));
        if inplace {
            if let Some(base) = statement.first().filter(|t| t.kind == Kind::Name) {
                out.push(base.text.clone());
            }
        }
    }
    out
}

/// The target token ranges of an assignment statement (`a = b = 1` has two), or of an
/// augmented assignment.
fn targets(statement: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, token) in statement.iter().enumerate() {
        if token.kind != Kind::Op {
            continue;
        }
        match token.text.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth = depth.saturating_sub(1),
            "=" if depth == 0 => {
                out.push(&statement[start..i]);
                start = i + 1;
            }
            op if depth == 0
                && op.len() >= 2
                && op.ends_with('=')
                && !matches!(op, "==" | "!=" | "<=" | ">=" | ":=") =>
            {
                out.push(&statement[start..i]);
                return out;
            }
            _ => {}
        }
    }
    out
}

/// Names of a target that are bound whole (not `x[...]`, `x.a`), at any tuple depth.
fn bare_names(target: &[Token]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, token) in target.iter().enumerate() {
        if token.kind != Kind::Name || is_keyword(&token.text) {
            continue;
        }
        let after_dot = i > 0 && target[i - 1].is_op(".");
        let continued = target
            .get(i + 1)
            .is_some_and(|t| t.is_op("[") || t.is_op(".") || t.is_op("("));
        let inside_subscript = target[..i].iter().filter(|t| t.is_op("[")).count()
            > target[..i].iter().filter(|t| t.is_op("]")).count();
        if !after_dot && !continued && !inside_subscript {
            out.push(token.text.clone());
        }
    }
    out
}

/// String literals the cell uses as column labels of a name: `x['a']`, `x[['a', 'b']]`.
pub fn subscript_labels(tokens: &[Token]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        if token.kind != Kind::Name || i > 0 && tokens[i - 1].is_op(".") {
            continue;
        }
        let rest = &tokens[i + 1..];
        let list = match rest {
            [open, inner, ..] if open.is_op("[") && inner.is_op("[") => &rest[2..],
            [open, ..] if open.is_op("[") => &rest[1..],
            _ => continue,
        };
        for item in list.chunks(2) {
            match item {
                [label, sep] if label.kind == Kind::Str && (sep.is_op(",") || sep.is_op("]")) => {
                    if let Some(value) = &label.value {
                        out.push((token.text.clone(), value.clone()));
                    }
                    if sep.is_op("]") {
                        break;
                    }
                }
                _ => break,
            }
        }
    }
    out
}

/// `(name, file)` for each `name = <module>.read_csv('file', ...)` (and `read_table`,
/// `read_excel`, `read_json`, `read_parquet`).
pub fn loaded_files(tokens: &[Token]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for statement in statements(tokens) {
        let [name, eq, rest @ ..] = statement else {
            continue;
        };
        if name.kind != Kind::Name || !eq.is_op("=") {
            continue;
        }
        for w in rest.windows(3) {
            if w[0].text.starts_with("read_") && w[1].is_op("(") {
                if let Some(file) = &w[2].value {
                    out.push((name.text.clone(), file.clone()));
                }
            }
        }
    }
    out
}

const KEYWORDS: [&str; 35] = [
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield",
];

/// Whether `word` is a Python keyword.
pub fn is_keyword(word: &str) -> bool {
    KEYWORDS.contains(&word)
}

#[cfg(test)]
mod tests {
    use super::super::tokens::tokenize;
    use super::*;

    fn toks(code: &str) -> Vec<Token> {
        tokenize(code).expect("test code tokenizes")
    }

    #[test]
    fn imports_bind_their_aliases() {
        let t = toks("import pandas as pd\nimport os.path\nfrom a import (b, c as d)");
        assert_eq!(imported(&t), ["pd", "os", "b", "d"]);
    }

    #[test]
    fn assignments_bind_their_bare_targets_only() {
        let t = toks("a, (b, c) = f()\nd = e = 1\ndf['x'] = 2\ndf.y = 3\nn += 1\nfor i, j in z:\n  k = i\ndef g(): pass");
        assert_eq!(
            assigned(&t),
            ["a", "b", "c", "d", "e", "n", "i", "j", "k", "g"]
        );
        assert_eq!(mutated(&t), ["df", "df"]);
        assert_eq!(mutated(&toks("df.drop(columns='a', inplace=True)")), ["df"]);
        assert!(assigned(&toks("f(x=1)\na == b")).is_empty());
    }

    #[test]
    fn column_labels_come_from_subscripts() {
        let t = toks("df['a'].mean() + df[['b', 'c']].sum() + df.x['no'] + d[k]");
        let labels: Vec<String> = subscript_labels(&t).into_iter().map(|(_, l)| l).collect();
        assert_eq!(labels, ["a", "b", "c"]);
        assert_eq!(
            loaded_files(&toks("df = pd.read_csv('x.csv', sep=';')")),
            [("df".to_string(), "x.csv".to_string())]
        );
    }
}
