//! Reading a model's reply: its fenced code blocks (```python, ```repl or a bare ```), the
//! transform loop's `DONE`, and the RLM loop's `FINAL(answer)` and `FINAL_VAR(name)` written
//! outside code blocks.

/// A reply split at its fences: the code of each complete block, trimmed and not empty, and
/// the text outside them. A block opens with a line starting with three backticks (an info
/// string such as `python`, `py` or `repl` may follow) and closes with a line of three
/// backticks; an unclosed block is neither code nor prose.
fn split(reply: &str) -> (Vec<String>, String) {
    let (mut blocks, mut prose) = (Vec::new(), String::new());
    let mut open: Option<Vec<&str>> = None;
    for line in reply.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => open = Some(Vec::new()),
            (Some(lines), true) => {
                let code = lines.join("\n").trim_matches('\n').to_owned();
                if !code.trim().is_empty() {
                    blocks.push(code);
                }
                open = None;
            }
            (Some(lines), false) => lines.push(line),
            (None, false) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    (blocks, prose)
}

/// The code of every complete block of `reply`, in order.
pub fn code_blocks(reply: &str) -> Vec<String> {
    split(reply).0
}

/// The code of the last fenced block of `reply`; `None` when it has no complete block.
pub fn last_code_block(reply: &str) -> Option<String> {
    split(reply).0.pop()
}

/// How a reply of the RLM loop ends it, written outside its code blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Final {
    /// `FINAL(answer)`: the text between the parentheses.
    Answer(String),
    /// `FINAL_VAR(name)`: the session variable holding the answer.
    Var(String),
}

/// The `FINAL(...)` or `FINAL_VAR(...)` that starts a line outside the code blocks of
/// `reply`, if any. `FINAL(`'s answer runs to the last `)` of the prose after it, so it may
/// span lines and hold parentheses.
pub fn final_of(reply: &str) -> Option<Final> {
    let prose = split(reply).1;
    let mut offset = 0;
    for line in prose.split_inclusive('\n') {
        let start = offset + (line.len() - line.trim_start().len());
        offset += line.len();
        let rest = &prose[start..];
        if let Some(inner) = rest.strip_prefix("FINAL_VAR(") {
            let name = inner.split(')').next().unwrap_or_default();
            let name = name.trim().trim_matches(|c| c == '"' || c == '\'');
            return Some(Final::Var(name.to_owned()));
        }
        if let Some(inner) = rest.strip_prefix("FINAL(") {
            let end = inner.rfind(')').unwrap_or(inner.len());
            return Some(Final::Answer(inner[..end].trim().to_owned()));
        }
    }
    None
}

/// Whether `reply` accepts the result: `DONE` alone, or a reply without a code block that has
/// `DONE` alone on a line (a word such as "done" inside prose does not count).
pub fn says_done(reply: &str) -> bool {
    let alone = |text: &str| text.trim().trim_end_matches('.') == "DONE";
    alone(reply) || (last_code_block(reply).is_none() && reply.lines().any(alone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_block_wins_whatever_its_info_string() {
        let reply = "First:\n```python\nx = 1\n```\nthen\n```\ny = 2\nz = 3\n```\n";
        assert_eq!(last_code_block(reply).as_deref(), Some("y = 2\nz = 3"));
        let reply = "```py\nresult = df\n```";
        assert_eq!(last_code_block(reply).as_deref(), Some("result = df"));
    }

    #[test]
    fn an_unclosed_or_empty_block_is_no_block() {
        assert_eq!(last_code_block("```python\nx = 1\n"), None);
        assert_eq!(last_code_block("```python\n\n```"), None);
        assert_eq!(
            code_blocks("```repl\na = 1\n```\ntext\n```\nb = 2\n```"),
            ["a = 1", "b = 2"]
        );
        assert_eq!(last_code_block("no code here"), None);
        let reply = "```python\nx = 1\n```\n```python\nunfinished";
        assert_eq!(last_code_block(reply).as_deref(), Some("x = 1"));
    }

    #[test]
    fn done_counts_alone_or_without_code() {
        assert!(says_done("DONE"));
        assert!(says_done("  DONE.\n"));
        assert!(says_done("The result looks right.\nDONE"));
        assert!(!says_done("I am done with it"));
        assert!(!says_done("DONE\n```python\nresult = df.head()\n```"));
        assert!(!says_done("```python\nresult = 1\n```"));
    }

    #[test]
    fn final_is_read_outside_code_blocks_only() {
        let reply = "Done.\nFINAL(the total is f(3) = 9)\n";
        assert_eq!(
            final_of(reply),
            Some(Final::Answer("the total is f(3) = 9".into()))
        );
        let reply = "```repl\nx = 1\nFINAL(x)\n```\nstill working";
        assert_eq!(final_of(reply), None);
        let reply = "```repl\nanswer = 42\n```\n  FINAL_VAR(answer)";
        assert_eq!(final_of(reply), Some(Final::Var("answer".into())));
        assert_eq!(final_of("FINAL_VAR('x')"), Some(Final::Var("x".into())));
        assert_eq!(final_of("I will call FINAL(x) later"), None);
    }
}
