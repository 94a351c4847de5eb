//! Error messages reduced to what they say rather than what they name: paths, numbers and
//! quoted names are abstracted so that `KeyError: 'colA'` and `KeyError: 'price'` read the
//! same (`KeyError: <name>`). The original message is always kept next to its normal form.

/// The normal form of an error message: quoted text becomes `<name>` (or `<str>` when it is
/// not a single identifier-like word), paths `<path>`, numbers `<num>`, hex addresses `<addr>`,
/// and runs of whitespace one space. Only the first line is kept, capped in length.
pub fn normalize_message(message: &str) -> String {
    const MAX: usize = 240;
    let first_line = message.lines().next().unwrap_or("").trim();
    let chars: Vec<char> = first_line.chars().collect();
    let mut out = String::with_capacity(first_line.len());
    let mut i = 0;
    while i < chars.len() && out.len() < MAX {
        let c = chars[i];
        if c == '\'' || c == '"' {
            if let Some(end) = chars[i + 1..].iter().position(|&q| q == c) {
                let quoted: String = chars[i + 1..i + 1 + end].iter().collect();
                out.push_str(abstract_quoted(&quoted));
                i += end + 2;
                continue;
            }
        }
        if c == '/' && (i == 0 || chars[i - 1].is_whitespace() || chars[i - 1] == '(') {
            let end = chars[i..]
                .iter()
                .position(|ch| ch.is_whitespace() || matches!(ch, ',' | ')' | ':' | ';'))
                .map_or(chars.len(), |n| i + n);
            out.push_str("<path>");
            i = end;
            continue;
        }
        if c == '0' && chars.get(i + 1) == Some(&'x') {
            let end = chars[i + 2..]
                .iter()
                .position(|ch| !ch.is_ascii_hexdigit())
                .map_or(chars.len(), |n| i + 2 + n);
            out.push_str("<addr>");
            i = end;
            continue;
        }
        let starts_word = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c.is_ascii_digit() && starts_word {
            let end = chars[i..]
                .iter()
                .position(|ch| !(ch.is_ascii_digit() || *ch == '.' || *ch == '_'))
                .map_or(chars.len(), |n| i + n);
            out.push_str("<num>");
            i = end;
            continue;
        }
        if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
        i += 1;
    }
    out.trim().to_owned()
}

fn abstract_quoted(quoted: &str) -> &'static str {
    if quoted.starts_with('/') || quoted.contains("/") && quoted.contains('.') {
        "<path>"
    } else if !quoted.is_empty()
        && quoted
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-'))
    {
        "<name>"
    } else {
        "<str>"
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_message;

    #[test]
    fn names_numbers_and_paths_are_abstracted() {
        assert_eq!(normalize_message("'price'"), "<name>");
        assert_eq!(
            normalize_message("'DataFrame' object has no attribute 'append'"),
            "<name> object has no attribute <name>"
        );
        assert_eq!(
            normalize_message("[Errno 2] No such file or directory: '/tmp/x/data.csv'"),
            "[Errno <num>] No such file or directory: <path>"
        );
        assert_eq!(
            normalize_message("index 10 is out of bounds for axis 0 with size 3"),
            "index <num> is out of bounds for axis <num> with size <num>"
        );
        assert_eq!(
            normalize_message("<object at 0x7f3a2b> failed\nsecond line"),
            "<object at <addr>> failed"
        );
        assert_eq!(normalize_message("x1 and 2x"), "x1 and <num>x");
    }
}
