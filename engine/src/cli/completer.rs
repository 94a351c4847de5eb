//! Tab completion for the REPL's line editor: the word before the cursor (identifier
//! characters and dots, as the worker defines it) is completed from the session's namespace
//! through `session.complete`; Tab at the start of an indented line inserts four spaces.
//! rustyline calls it on the editor's own thread, which waits for the answer on the runtime.

use std::time::Duration;

use rustyline::completion::Completer;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::validate::Validator;
use rustyline::{Context, Helper};
use tokio::runtime::Handle;

use super::backend;

/// How long a Tab waits for the session before it completes nothing.
const COMPLETE_WAIT: Duration = Duration::from_secs(3);

/// The REPL's helper for rustyline: completion only.
pub struct ReplHelper {
    completer: backend::Completer,
    runtime: Handle,
}

impl ReplHelper {
    pub fn new(completer: backend::Completer, runtime: Handle) -> ReplHelper {
        ReplHelper { completer, runtime }
    }
}

/// Where the word that ends at byte `pos` of `line` starts.
fn word_start(line: &str, pos: usize) -> usize {
    line[..pos]
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_alphanumeric() || *c == '_' || *c == '.')
        .last()
        .map_or(pos, |(at, _)| at)
}

impl Completer for ReplHelper {
    type Candidate = String;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<String>)> {
        let start = word_start(line, pos);
        if start == pos {
            // Nothing to complete: at the start of a line, Tab indents.
            let indent = line[..pos].trim().is_empty();
            return Ok((pos, if indent { vec!["    ".into()] } else { vec![] }));
        }
        let cursor = line[..pos].chars().count();
        let asked = self.completer.complete(line, cursor);
        let matches = self
            .runtime
            .block_on(async { tokio::time::timeout(COMPLETE_WAIT, asked).await })
            .unwrap_or_default();
        Ok((start, matches))
    }
}

impl Hinter for ReplHelper {
    type Hint = String;
}

impl Highlighter for ReplHelper {}

impl Validator for ReplHelper {}

impl Helper for ReplHelper {}

#[cfg(test)]
mod tests {
    use super::word_start;

    #[test]
    fn the_word_is_the_dotted_name_before_the_cursor() {
        assert_eq!(word_start("print(df.col", 12), 6);
        assert_eq!(word_start("x = ab", 6), 4);
        assert_eq!(word_start("f(", 2), 2);
        assert_eq!(word_start("naïve.up", 9), 0);
        assert_eq!(word_start("abc def", 3), 0);
    }
}
