//! MIL identifier rules for function, value and op names.

/// Whether `name` is a MIL identifier: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_valid_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
