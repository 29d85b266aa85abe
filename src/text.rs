//! Text from untrusted places (SKR answers, KCP objects) made safe to print: bounded in
//! length and without control characters, so it can neither flood nor forge a log line, a
//! condition or an Event.

/// `text` with every control character (newlines, escape sequences) replaced by a space and
/// cut to at most `max_chars` characters, marked with `...` when cut.
pub fn bounded(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars * 4));
    for (count, c) in text.chars().enumerate() {
        if count == max_chars {
            out.push_str("...");
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

/// Names shown by [`sample`] at most.
pub const SAMPLE_NAMES: usize = 3;

/// Characters of each name [`sample`] shows at most.
pub const SAMPLE_NAME_CHARS: usize = 64;

/// How many `names` there are and the first [`SAMPLE_NAMES`] of them, each [`bounded`] to
/// [`SAMPLE_NAME_CHARS`]: `3 (a, b, c)`, `10000 (a, b, c, ...)`, `0`. At most about 230
/// characters however many and however long the names are.
pub fn sample<S: AsRef<str>>(names: &[S]) -> String {
    if names.is_empty() {
        return "0".to_owned();
    }
    let shown: Vec<String> = names.iter().take(SAMPLE_NAMES).map(|n| bounded(n.as_ref(), SAMPLE_NAME_CHARS)).collect();
    let more = if names.len() > SAMPLE_NAMES { ", ..." } else { "" };
    format!("{} ({}{more})", names.len(), shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_spaces_and_length_is_capped() {
        assert_eq!(bounded("a\nb\x1b[31mc\u{7f}", 100), "a b [31mc ");
        assert_eq!(bounded("abcdef", 3), "abc...");
        assert_eq!(bounded("äöü", 2), "äö...");
        assert_eq!(bounded("", 0), "");
    }

    #[test]
    fn a_sample_is_a_count_and_a_few_bounded_names() {
        assert_eq!(sample::<String>(&[]), "0");
        assert_eq!(sample(&["a", "b"]), "2 (a, b)");
        let names: Vec<String> =
            (0..10_000).map(|i| format!("{}-{i}\n2026-01-01 ERROR forged", "x".repeat(253))).collect();
        let text = sample(&names);
        assert!(text.starts_with("10000 (xxx"), "{text}");
        assert!(text.ends_with(", ...)"), "{text}");
        assert!(text.chars().count() <= 5 + 3 * (SAMPLE_NAME_CHARS + 5) + 10, "{} chars", text.len());
        assert!(!text.contains('\n'));
    }
}
