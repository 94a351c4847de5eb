//! When the REPL has read a whole statement. Simpler than Python's `code.compile_command`,
//! and predictable:
//!
//! - inside an open bracket or an unterminated triple-quoted string, or after a line that ends
//!   with a backslash, more lines are needed;
//! - otherwise, input that opens a block (a line ending with `:` outside strings, brackets and
//!   comments, or a decorator line starting with `@`) runs once an empty line is entered;
//! - anything else runs at once;
//! - a block also ends, without the empty line, when a line at the left margin follows its
//!   indented body (unless it goes on with `else`, `elif`, `except` or `finally`): that line
//!   starts the next statement, as in pasted code.
//!
//! Whatever this lets through, Python compiles and reports (a `SyntaxError` is an ordinary
//! error result).

/// Whether `buffer` (lines read so far, each ending with `\n`) should run now.
pub fn is_complete(buffer: &str) -> bool {
    let scan = scan(buffer);
    if scan.depth > 0 || scan.in_triple_string || scan.continued {
        return false;
    }
    if !scan.opens_block {
        return true;
    }
    let last_line = buffer
        .strip_suffix('\n')
        .unwrap_or(buffer)
        .rsplit('\n')
        .next()
        .unwrap_or_default();
    last_line.trim().is_empty()
}

/// Whether `line`, read after `buffer` (an unfinished statement), starts a statement of its
/// own, so that `buffer` should run first: `buffer` is a block with an indented body, and
/// `line` is code at the left margin that does not go on with the block.
pub fn starts_next_statement(buffer: &str, line: &str) -> bool {
    let scan = scan(buffer);
    if !scan.opens_block || scan.depth > 0 || scan.in_triple_string || scan.continued {
        return false;
    }
    let body_indented = buffer
        .lines()
        .skip(1)
        .any(|body| body.starts_with([' ', '\t']) && !body.trim().is_empty());
    let at_margin = !line.starts_with([' ', '\t']) && !line.trim().is_empty();
    let continues = ["else", "elif", "except", "finally"].iter().any(|keyword| {
        line.strip_prefix(keyword)
            .is_some_and(|rest| rest.starts_with([':', ' ', '\t']))
    });
    body_indented && at_margin && !line.starts_with('#') && !continues
}

/// What a buffer leaves open.
#[derive(Debug, Default)]
struct Scan {
    /// Brackets opened and not closed.
    depth: usize,
    in_triple_string: bool,
    /// The last line ends with a backslash outside a string.
    continued: bool,
    /// A line ends with `:` at bracket depth 0, or starts with `@`.
    opens_block: bool,
}

fn scan(buffer: &str) -> Scan {
    let chars: Vec<char> = buffer.chars().collect();
    let mut scan = Scan::default();
    // The open string's quote character and whether it is triple-quoted.
    let mut string: Option<(char, bool)> = None;
    let mut last_significant: Option<char> = None;
    let mut line_start = true;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let triple_at = |at: usize, quote: char| {
            chars
                .get(at..at + 3)
                .is_some_and(|s| s.iter().all(|&q| q == quote))
        };
        if let Some((quote, triple)) = string {
            match c {
                '\\' => i += 1,
                _ if triple && c == quote && triple_at(i, quote) => {
                    string = None;
                    i += 2;
                }
                _ if !triple && c == quote => string = None,
                // An unterminated one-line string ends with its line; Python reports it.
                '\n' if !triple => {
                    string = None;
                    end_line(&mut scan, &mut last_significant);
                    line_start = true;
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        match c {
            '#' => {
                while i + 1 < chars.len() && chars[i + 1] != '\n' {
                    i += 1;
                }
            }
            '\'' | '"' => {
                let triple = triple_at(i, c);
                string = Some((c, triple));
                last_significant = Some(c);
                if triple {
                    i += 2;
                }
            }
            '(' | '[' | '{' => {
                scan.depth += 1;
                last_significant = Some(c);
            }
            ')' | ']' | '}' => {
                scan.depth = scan.depth.saturating_sub(1);
                last_significant = Some(c);
            }
            '\\' if chars.get(i + 1) == Some(&'\n') => {
                // A joined line: the statement goes on.
                scan.continued = i + 2 == chars.len();
                i += 2;
                continue;
            }
            '\n' => {
                if scan.depth == 0 {
                    end_line(&mut scan, &mut last_significant);
                }
                line_start = true;
                i += 1;
                continue;
            }
            '@' if line_start && scan.depth == 0 => {
                scan.opens_block = true;
                last_significant = Some(c);
            }
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            _ => last_significant = Some(c),
        }
        line_start = false;
        i += 1;
    }
    scan.in_triple_string = matches!(string, Some((_, true)));
    scan
}

/// A logical line ended at bracket depth 0.
fn end_line(scan: &mut Scan, last_significant: &mut Option<char>) {
    if *last_significant == Some(':') {
        scan.opens_block = true;
    }
    *last_significant = None;
}

#[cfg(test)]
mod tests {
    use super::{is_complete, starts_next_statement};

    #[test]
    fn a_line_at_the_margin_after_a_block_body_starts_the_next_statement() {
        let block = "for i in range(3):\n    print(i)\n";
        assert!(starts_next_statement(block, "print('done')"));
        assert!(!starts_next_statement(block, "    print(i * 2)"));
        assert!(!starts_next_statement(block, "else:"));
        assert!(!starts_next_statement(block, "# a comment"));
        assert!(!starts_next_statement(
            "try:\n    f()\n",
            "except ValueError:"
        ));
        assert!(!starts_next_statement("try:\n    f()\n", "finally:"));
        // A decorator's function, or a header without its body yet, goes on.
        assert!(!starts_next_statement("@decorator\n", "def f(): pass"));
        assert!(!starts_next_statement("def f():\n", "return 1"));
        assert!(!starts_next_statement("x = [1,\n", "2]"));
        assert!(!starts_next_statement("x = 1\n", "y = 2"));
    }

    #[test]
    fn a_simple_statement_runs_at_once() {
        assert!(is_complete("x = 6\n"));
        assert!(is_complete("x * 7\n"));
        assert!(is_complete("if x: pass\n"));
        assert!(is_complete("d = {'a': 1}  # a comment:\n"));
        assert!(is_complete("s = 'not a block:'\n"));
        assert!(is_complete("f = lambda: 0\n"));
    }

    #[test]
    fn a_block_runs_after_an_empty_line() {
        assert!(!is_complete("def f():\n"));
        assert!(!is_complete("def f():\n    return 5\n"));
        assert!(is_complete("def f():\n    return 5\n\n"));
        assert!(!is_complete("for i in range(3):  # loop\n"));
        assert!(!is_complete("@decorator\n"));
        assert!(!is_complete("@decorator\ndef f(): pass\n"));
        assert!(is_complete("@decorator\ndef f(): pass\n\n"));
    }

    #[test]
    fn open_brackets_and_strings_need_more_lines() {
        assert!(!is_complete("x = [1,\n"));
        assert!(!is_complete("x = [1,\n\n"));
        assert!(is_complete("x = [1,\n     2]\n"));
        assert!(!is_complete("d = {\n  'a':\n"));
        assert!(is_complete("d = {\n  'a':\n 1}\n"));
        assert!(!is_complete("s = \"\"\"first\n"));
        assert!(!is_complete("s = \"\"\"first\n\n"));
        assert!(is_complete("s = \"\"\"first\nsecond:\"\"\"\n"));
        assert!(!is_complete("x = 1 + \\\n"));
        assert!(is_complete("x = 1 + \\\n 2\n"));
        assert!(is_complete("s = ')'\n"));
        assert!(is_complete("s = 'it\\'s ('\n"));
    }

    #[test]
    fn a_bracketed_header_still_opens_a_block() {
        assert!(!is_complete("def f(a,\n      b):\n"));
        assert!(is_complete("def f(a,\n      b):\n    return a\n\n"));
    }
}
