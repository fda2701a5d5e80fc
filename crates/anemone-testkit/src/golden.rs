//! Golden files: compared byte for byte; `ANEMONE_BLESS=1` rewrites them on purpose.

use std::path::Path;

/// Whether this run rewrites golden files (`ANEMONE_BLESS=1`).
pub fn blessing() -> bool {
    std::env::var("ANEMONE_BLESS").is_ok_and(|v| v == "1")
}

/// Asserts that `golden` holds exactly `actual`; with `ANEMONE_BLESS=1` writes it instead.
/// A mismatch names the first differing line (text) or byte offset (binary).
pub fn assert_golden(golden: &Path, actual: &[u8]) {
    if blessing() {
        if let Some(dir) = golden.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        std::fs::write(golden, actual).unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
        return;
    }
    let expected = std::fs::read(golden).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with ANEMONE_BLESS=1 to create it",
            golden.display()
        )
    });
    if expected == actual {
        return;
    }
    let place = match (std::str::from_utf8(&expected), std::str::from_utf8(actual)) {
        (Ok(want), Ok(got)) => {
            let line = want
                .lines()
                .zip(got.lines())
                .position(|(w, g)| w != g)
                .unwrap_or_else(|| want.lines().count().min(got.lines().count()));
            format!(
                "line {}: golden {:?}, now {:?}",
                line + 1,
                want.lines().nth(line).unwrap_or("<end>"),
                got.lines().nth(line).unwrap_or("<end>")
            )
        }
        _ => {
            let offset = expected
                .iter()
                .zip(actual)
                .position(|(w, g)| w != g)
                .unwrap_or(expected.len().min(actual.len()));
            format!(
                "byte {offset} (golden {} bytes, now {} bytes)",
                expected.len(),
                actual.len()
            )
        }
    };
    panic!(
        "{} differs at {place}; if the change is intended, rerun with ANEMONE_BLESS=1",
        golden.display()
    );
}
