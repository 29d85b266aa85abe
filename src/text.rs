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
}
