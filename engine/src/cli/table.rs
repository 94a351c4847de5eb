//! Plain-text tables and the human units (bytes, ages) that `session` and `top` print.

use std::time::{SystemTime, UNIX_EPOCH};

/// `rows` under `headers`, each column as wide as its widest cell, one line per row.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(&mut headers.iter().copied());
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

/// The table of `rows`, or the line `none` when there are no rows.
pub fn render_or(none: &str, headers: &[&str], rows: &[Vec<String>]) -> String {
    match rows.is_empty() {
        true => format!("{none}\n"),
        false => render(headers, rows),
    }
}

/// `bytes` in B, KiB, MiB or GiB with one decimal.
pub fn bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

/// How long ago `epoch_s` (seconds since the Unix epoch) was: `42s`, `5m`, `3h`, `2d`.
pub fn age(epoch_s: f64) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    let secs = (now - epoch_s).max(0.0) as u64;
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        7200..=172_799 => format!("{}h", secs / 3600),
        _ => format!("{}d", secs / 86_400),
    }
}

/// `value`, or `-` when there is none.
pub fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let rows = vec![
            vec!["s-1".to_owned(), "a-long-name".to_owned()],
            vec!["s-22".to_owned(), "-".to_owned()],
        ];
        assert_eq!(
            render(&["ID", "NAME"], &rows),
            "ID    NAME\ns-1   a-long-name\ns-22  -\n"
        );
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(bytes(5 << 30), "5.0 GiB");
    }
}
