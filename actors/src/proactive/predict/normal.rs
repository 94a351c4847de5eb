//! The canonical form of a cell: the key under which a speculative answer is cached, so that
//! a predicted `df['a'].value_counts()` matches the user's `# count\ndf["a"].value_counts()  `.
//!
//! Two codes with the same normal form are the same Python: the form is the token stream
//! (comments and layout inside brackets dropped, plain string literals re-quoted) written
//! back with only the spaces that keep tokens apart, so it reads back to the same tokens.

use std::collections::HashSet;

use super::tokens::{tokenize, Kind, Token};

/// The canonical form of `code`; `None` when it cannot be tokenized.
pub fn normalise(code: &str) -> Option<String> {
    tokenize(code).map(|tokens| render(&tokens))
}

/// Whether `code` mentions any of `names`, as a variable or an attribute; true when it does
/// not tokenize.
pub fn mentions_any(code: &str, names: &HashSet<String>) -> bool {
    tokenize(code).is_none_or(|tokens| {
        tokens
            .iter()
            .any(|t| t.kind == Kind::Name && names.contains(&t.text))
    })
}

/// Whether `code` is one expression statement and nothing else (conservative: the worker's
/// purity guard has the last word).
pub fn is_single_expression(code: &str) -> bool {
    tokenize(code).is_some_and(|tokens| single_expression(&tokens))
}

const STATEMENT_KEYWORDS: [&str; 24] = [
    "import", "from", "del", "global", "nonlocal", "def", "class", "return", "raise", "assert",
    "pass", "break", "continue", "with", "try", "except", "finally", "while", "for", "if", "elif",
    "else", "async", "yield",
];

/// [`is_single_expression`] on tokens.
pub fn single_expression(tokens: &[Token]) -> bool {
    let Some(first) = tokens.first() else {
        return false;
    };
    if first.kind == Kind::Name && STATEMENT_KEYWORDS.contains(&first.text.as_str()) {
        return false;
    }
    if first.is_op("@") || first.is_op("*") {
        return false;
    }
    let mut depth = 0usize;
    for token in tokens {
        match token.kind {
            Kind::Newline | Kind::Indent | Kind::Dedent => return false,
            Kind::Name if token.text == "yield" || token.text == "await" => return false,
            Kind::Op => match token.text.as_str() {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" => depth = depth.saturating_sub(1),
                ":=" => return false,
                ";" | "=" | ":" | "->" if depth == 0 => return false,
                op if depth == 0 && op.len() >= 2 && op.ends_with('=') && !is_comparison(op) => {
                    return false
                }
                _ => {}
            },
            _ => {}
        }
    }
    true
}

fn is_comparison(op: &str) -> bool {
    matches!(op, "==" | "!=" | "<=" | ">=")
}

const MERGING: &str = "+-*/%@&|^~<>=!:.";

/// Writes tokens back as code, with a space only where two tokens would otherwise run into
/// one, and one space per indentation level.
pub fn render(tokens: &[Token]) -> String {
    let mut out = String::new();
    let mut level = 0usize;
    let mut line_start = true;
    let mut previous: Option<&Token> = None;
    for token in tokens {
        match token.kind {
            Kind::Newline => {
                out.push('\n');
                line_start = true;
                previous = None;
                continue;
            }
            Kind::Indent => {
                level += 1;
                continue;
            }
            Kind::Dedent => {
                level = level.saturating_sub(1);
                continue;
            }
            _ => {}
        }
        if line_start {
            out.extend(std::iter::repeat_n(' ', level));
            line_start = false;
        } else if let Some(left) = previous {
            if needs_space(left, token) {
                out.push(' ');
            }
        }
        out.push_str(&token.text);
        previous = Some(token);
    }
    out
}

fn word_like(token: &Token) -> bool {
    matches!(token.kind, Kind::Name | Kind::Number | Kind::Slot)
}

fn needs_space(left: &Token, right: &Token) -> bool {
    if word_like(left) && (word_like(right) || right.kind == Kind::Str) {
        return true;
    }
    if left.kind == Kind::Str && (right.kind == Kind::Str || word_like(right)) {
        return true;
    }
    if left.kind == Kind::Number && right.text.starts_with('.') {
        return true;
    }
    if left.kind == Kind::Op && right.kind == Kind::Number && right.text.starts_with('.') {
        return left.text.ends_with('.');
    }
    left.kind == Kind::Op
        && right.kind == Kind::Op
        && left
            .text
            .chars()
            .last()
            .is_some_and(|c| MERGING.contains(c))
        && right
            .text
            .chars()
            .next()
            .is_some_and(|c| MERGING.contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &str, b: &str) {
        assert_eq!(normalise(a), normalise(b), "{a:?} vs {b:?}");
        assert!(normalise(a).is_some(), "{a:?} tokenizes");
    }

    fn differ(a: &str, b: &str) {
        assert_ne!(normalise(a), normalise(b), "{a:?} vs {b:?}");
    }

    #[test]
    fn comments_whitespace_and_quotes_do_not_matter() {
        same(
            "df['a'].value_counts()",
            "# count\ndf[\"a\"].value_counts()  ",
        );
        same(
            "df.groupby( 'a' )[ 'b' ].mean( )",
            "df.groupby('a')['b'].mean()",
        );
        same(
            "df.sort_values(by='a',\n    ascending=False)",
            "df.sort_values(by = 'a', ascending = False) # sorted",
        );
        same("x = 1 \\\n + 2", "x = 1 + 2");
        same("'''abc'''", "'abc'");
        same("u'abc'", "\"abc\"");
        same("r'abc'", "'abc'");
        same("\n\nif a:\n    b\n\n# done\n", "if a:\n  b");
    }

    #[test]
    fn different_python_has_different_forms() {
        differ("'\\n'", "r'\\n'");
        differ("'a\\tb'", "'a\\\\tb'");
        differ("f'{a}'", "'{a}'");
        differ("b'a'", "'a'");
        differ("df.head();", "df.head()");
        differ("a; b", "a\nb");
        differ("a\nb", "ab");
        differ("a b", "ab");
        differ("x ** 2", "x * * 2");
        differ("if a:\n  b\nc", "if a:\n  b\n  c");
        differ("'a'", "'a '");
        differ("'a\\'b'", "'a' 'b'");
        differ("r 'a'", "r'a'");
        differ("1 .real", "1.real");
    }

    #[test]
    fn forms_read_back_to_the_same_tokens() {
        for code in [
            "df[df['a'] > 3].shape",
            "x=-1",
            "a = b if c else -d ** 2",
            "print(f\"{x['a']:>{w}}\")",
            "s = '''two\nlines'''",
            "lambda x: x.a@b",
            "[x for x in y if not x]",
            "a[...]",
            "1.5e-3+.5",
        ] {
            let once = normalise(code).expect("tokenizes");
            assert_eq!(normalise(&once).as_deref(), Some(once.as_str()), "{code:?}");
        }
    }

    #[test]
    fn broken_code_has_no_form() {
        for code in [
            "df[",
            "'abc",
            "a)",
            "  x = 1",
            "if a:\n    b\n  c",
            "!ls",
            "x?",
        ] {
            assert_eq!(normalise(code), None, "{code:?}");
        }
    }

    #[test]
    fn single_expressions_are_told_apart_from_statements() {
        for code in [
            "df",
            "df.head()",
            "df['a'].value_counts()",
            "df[df.a == 1].shape",
            "df.sort_values(by='a').head(5)",
            "len(df)",
            "df.loc[:, 'a']",
            "# show\ndf.describe()\n",
        ] {
            assert!(is_single_expression(code), "{code:?}");
        }
        for code in [
            "x = 1",
            "df['a'] = 1",
            "x += 1",
            "import pandas as pd",
            "a; b",
            "a\nb",
            "df.head();",
            "for x in y:\n  x",
            "(y := 2)",
            "x: int",
            "del df",
            "",
        ] {
            assert!(!is_single_expression(code), "{code:?}");
        }
    }
}
