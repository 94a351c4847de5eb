//! Reading a model's reply in the transform loop: the last fenced code block (```python or a
//! bare ```), and whether the reply says `DONE`.

/// The code of the last fenced block of `reply`, trimmed; `None` when it has no complete block.
/// A block opens with a line starting with three backticks (an info string such as `python`
/// or `py` may follow) and closes with a line of three backticks.
pub fn last_code_block(reply: &str) -> Option<String> {
    let mut last = None;
    let mut open: Option<Vec<&str>> = None;
    for line in reply.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => open = Some(Vec::new()),
            (Some(lines), true) => {
                last = Some(lines.join("\n").trim_matches('\n').to_owned());
                open = None;
            }
            (Some(lines), false) => lines.push(line),
            (None, false) => {}
        }
    }
    last.filter(|code: &String| !code.trim().is_empty())
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
}
