//! Which statement of a cell failed (from its traceback), and code cut into the statements a
//! check compares with the statements that failed before: a failing approach is a statement,
//! not the whole cell around it.

/// Most pieces a check compares: longer code is cut into this many runs of lines.
const MAX_PIECES: usize = 8;

/// The line (from 1) of the cell's own code where the error was raised: the innermost frame
/// of the cell that ran (the first `<cell-N>` frame of the traceback), which is the cell's
/// statement that called into a library when the error came from one.
pub fn failing_line(traceback: &[String]) -> Option<u32> {
    let frames: Vec<(&str, u32)> = traceback
        .iter()
        .filter_map(|entry| {
            let rest = entry.trim_start().strip_prefix("File \"")?;
            let (file, rest) = rest.split_once('"')?;
            let digits: String = rest
                .trim_start_matches(", line ")
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            Some((file, digits.parse().ok()?))
        })
        .collect();
    let cell = frames
        .iter()
        .find(|(file, _)| file.starts_with("<cell-"))?
        .0;
    frames
        .iter()
        .rev()
        .find(|(file, _)| *file == cell)
        .map(|(_, line)| *line)
}

/// Line `line` (from 1) of `code`, if it has one that is not blank.
pub fn statement_at(code: &str, line: u32) -> Option<&str> {
    let text = code.lines().nth(line.checked_sub(1)? as usize)?;
    (!text.trim().is_empty()).then_some(text)
}

/// The statements of `code` a check compares: its non-blank, non-comment lines (in at most
/// [`MAX_PIECES`] runs), and the whole code too when it has more than one.
pub fn pieces(code: &str) -> Vec<String> {
    let lines: Vec<&str> = code
        .lines()
        .filter(|line| {
            let line = line.trim();
            !line.is_empty() && !line.starts_with('#')
        })
        .collect();
    if lines.len() <= 1 {
        return vec![code.to_owned()];
    }
    let per_piece = lines.len().div_ceil(MAX_PIECES);
    let mut pieces: Vec<String> = lines.chunks(per_piece).map(|run| run.join("\n")).collect();
    pieces.push(code.to_owned());
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cells_innermost_frame_is_the_failing_line() {
        let traceback: Vec<String> = [
            "Traceback (most recent call last):\n",
            "  File \"<cell-7>\", line 4, in <module>\n    y = f()\n",
            "  File \"<cell-7>\", line 3, in f\n    return {}[\"k\"]\n",
            "  File \"/usr/lib/python3/site-packages/pandas/core/frame.py\", line 12, in x\n",
            "KeyError: 'k'\n",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(failing_line(&traceback), Some(3));
        assert_eq!(failing_line(&[]), None);
        assert_eq!(statement_at("a = 1\n\nb = 2", 3), Some("b = 2"));
        assert_eq!(statement_at("a = 1\n\nb = 2", 2), None);
        assert_eq!(pieces("x = 1"), ["x = 1"]);
        assert_eq!(pieces("a\n# c\nb"), ["a", "b", "a\n# c\nb"]);
        assert_eq!(pieces(&"x\n".repeat(20)).len(), MAX_PIECES);
    }
}
