//! The repository's package validator (`tools/validate_mlpackage.py`, on coremltools' public
//! API) and the Python that runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::paths::repo_root;

pub const INSTALL_HINT: &str =
    "run `scripts/test.sh` once (it makes .venv with coremltools), or set ANEMONE_PYTHON to a \
     python with `pip install coremltools \"numpy<2.4\"`";

/// The Python the tests use: `$ANEMONE_PYTHON`, else the repository's `.venv` (made by
/// `scripts/test.sh`), else `python3` from the PATH.
pub fn python() -> PathBuf {
    if let Some(explicit) = std::env::var_os("ANEMONE_PYTHON") {
        return PathBuf::from(explicit);
    }
    let venv = repo_root().join(".venv/bin/python");
    if venv.is_file() {
        return venv;
    }
    PathBuf::from("python3")
}

/// Runs the test Python with `args`; panics with the install hint when it cannot start.
pub fn run_python(args: &[&std::ffi::OsStr]) -> Output {
    let python = python();
    Command::new(&python)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} not runnable ({e}); {INSTALL_HINT}", python.display()))
}

/// `$ANEMONE_VALIDATOR`, else `tools/validate_mlpackage.py` in the repository.
pub fn validator_script() -> PathBuf {
    std::env::var_os("ANEMONE_VALIDATOR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tools/validate_mlpackage.py"))
}

/// Asserts that coremltools accepts every package (`--strict`: warnings fail too); the panic
/// carries the validator's report.
pub fn validate_package(packages: &[&Path]) {
    let script = validator_script();
    assert!(
        script.is_file(),
        "validator not found at {}",
        script.display()
    );
    let mut args: Vec<&std::ffi::OsStr> =
        vec![script.as_os_str(), "--strict".as_ref(), "-q".as_ref()];
    args.extend(packages.iter().map(|p| p.as_os_str()));
    let out = run_python(&args);
    assert!(
        out.status.success(),
        "coremltools rejected {packages:?} (exit {:?}):\n{}{}\n{INSTALL_HINT}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`validate_package`] of one package.
pub fn validate(package: &Path) {
    validate_package(&[package]);
}
