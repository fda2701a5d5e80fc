//! Reading a bundle back: the manifest (schema-checked) and the verification of every file's
//! sha256 against it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::manifest::{FileHash, Manifest, MANIFEST_FILE, SCHEMA_VERSION};
use super::writer::io;
use super::BundleError;

/// Reads and schema-checks `dir/anemone.json`.
pub fn read_manifest(dir: &Path) -> Result<Manifest, BundleError> {
    let path = dir.join(MANIFEST_FILE);
    let text = fs::read_to_string(&path).map_err(io(&path))?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| BundleError::Json {
        path: path.clone(),
        source: e,
    })?;
    let version = value.get("schema_version").and_then(|v| v.as_u64());
    if version != Some(SCHEMA_VERSION as u64) {
        return Err(BundleError::Schema {
            path,
            problem: format!(
                "schema_version {version:?}; this anemone reads version {SCHEMA_VERSION}"
            ),
        });
    }
    let manifest: Manifest = serde_json::from_value(value).map_err(|e| BundleError::Json {
        path: path.clone(),
        source: e,
    })?;
    // The architecture is a family name: one the registry does not know cannot be run.
    crate::families::by_name(manifest.architecture.name()).map_err(|e| BundleError::Schema {
        path,
        problem: e.to_string(),
    })?;
    Ok(manifest)
}

/// The outcome of checking one file against the manifest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FileCheck {
    pub path: String,
    pub expected_sha256: Option<String>,
    pub found_sha256: Option<String>,
    pub ok: bool,
}

/// Files the operating system drops into any directory it shows (Finder's `.DS_Store`,
/// AppleDouble `._*` files, custom folder icons `Icon\r`, Windows' `Thumbs.db`/`desktop.ini`).
/// Verification skips them, and says so.
pub fn is_os_metadata(name: &str) -> bool {
    matches!(name, ".DS_Store" | "Icon\r" | "Thumbs.db" | "desktop.ini") || name.starts_with("._")
}

/// The outcome of verifying a bundle's files.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Verification {
    pub checks: Vec<FileCheck>,
    /// OS metadata files present but not checked (relative `/`-separated paths).
    pub ignored: Vec<String>,
}

impl Verification {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.ok)
    }
}

/// Hashes every file of the bundle (in parallel) and compares with the manifest: missing,
/// changed and unlisted files all fail; OS metadata files ([`is_os_metadata`]) are skipped and
/// listed in [`Verification::ignored`].
pub fn verify_bundle(dir: &Path, manifest: &Manifest) -> Result<Verification, BundleError> {
    let (found, ignored) = hash_tree(dir, &BTreeMap::new())?;
    let mut checks = Vec::new();
    for (path, expected) in &manifest.files {
        let got = found.get(path);
        checks.push(FileCheck {
            path: path.clone(),
            expected_sha256: Some(expected.sha256.clone()),
            found_sha256: got.map(|g| g.sha256.clone()),
            ok: got == Some(expected),
        });
    }
    for (path, got) in &found {
        if !manifest.files.contains_key(path) {
            checks.push(FileCheck {
                path: path.clone(),
                expected_sha256: None,
                found_sha256: Some(got.sha256.clone()),
                ok: false,
            });
        }
    }
    if !ignored.is_empty() {
        tracing::info!(
            "{}: not verified (OS metadata files): {}",
            dir.display(),
            ignored.join(", ")
        );
    }
    Ok(Verification { checks, ignored })
}

/// [`verify_bundle`]'s checks alone.
pub fn verify_files(dir: &Path, manifest: &Manifest) -> Result<Vec<FileCheck>, BundleError> {
    Ok(verify_bundle(dir, manifest)?.checks)
}

/// sha256 of every regular file under `root` except the manifest and OS metadata files, keyed
/// by its `/`-separated relative path, hashed in parallel; files in `known` (by path, size
/// checked) are not read again. Also returns the OS metadata files skipped.
pub(crate) fn hash_tree(
    root: &Path,
    known: &BTreeMap<PathBuf, FileHash>,
) -> Result<(BTreeMap<String, FileHash>, Vec<String>), BundleError> {
    use rayon::prelude::*;
    let mut files = Vec::new();
    let mut ignored = Vec::new();
    list_files(root, root, &mut files, &mut ignored)?;
    let hashed = files
        .into_par_iter()
        .map(|(rel, path, len)| {
            let hash = match known.get(&path) {
                Some(k) if k.bytes == len => k.clone(),
                _ => {
                    let h = anemone_checkpoint::hash_file(&path)?;
                    FileHash {
                        sha256: h.sha256,
                        bytes: h.bytes,
                    }
                }
            };
            Ok((rel, hash))
        })
        .collect::<Result<BTreeMap<_, _>, BundleError>>()?;
    Ok((hashed, ignored))
}

/// (relative path, path, length) of every regular file under `dir`.
fn list_files(
    root: &Path,
    dir: &Path,
    out: &mut Vec<(String, PathBuf, u64)>,
    ignored: &mut Vec<String>,
) -> Result<(), BundleError> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    entries.sort();
    for path in entries {
        let meta = fs::symlink_metadata(&path).map_err(io(&path))?;
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if is_os_metadata(&name) {
            ignored.push(rel);
        } else if meta.is_dir() {
            list_files(root, &path, out, ignored)?;
        } else if meta.is_file() && rel != MANIFEST_FILE {
            out.push((rel, path, meta.len()));
        }
    }
    Ok(())
}

/// Where the functions a manifest declares for a package disagree with the package itself:
/// functions, inputs, outputs and states by name, in order, with dtype and shape. Empty when
/// they agree.
pub fn signature_mismatches(
    declared: &[crate::ane::FunctionSignature],
    program: &anemone_mil::Program,
) -> Vec<String> {
    let actual: Vec<crate::ane::FunctionSignature> = program
        .functions()
        .iter()
        .map(|f| crate::ane::FunctionSignature::of_function(f, None))
        .collect();
    mismatches(declared, &actual)
}

/// [`signature_mismatches`] against the interfaces of a package's model proto
/// ([`anemone_mil::read_package_interface`]: no weights read).
pub fn interface_mismatches(
    declared: &[crate::ane::FunctionSignature],
    interfaces: &[anemone_mil::FunctionInterface],
) -> Vec<String> {
    let actual: Vec<crate::ane::FunctionSignature> = interfaces
        .iter()
        .map(crate::ane::FunctionSignature::of_interface)
        .collect();
    mismatches(declared, &actual)
}

fn mismatches(
    declared: &[crate::ane::FunctionSignature],
    actual: &[crate::ane::FunctionSignature],
) -> Vec<String> {
    use crate::ane::TensorSignature;
    let show = |t: &TensorSignature| format!("`{}` {} {:?}", t.name, t.dtype.mil_name(), t.shape);
    let mut problems = Vec::new();
    for d in declared {
        let Some(a) = actual.iter().find(|a| a.name == d.name) else {
            problems.push(format!("function `{}` is not in the package", d.name));
            continue;
        };
        for (what, want, got) in [
            ("inputs", &d.inputs, &a.inputs),
            ("outputs", &d.outputs, &a.outputs),
            ("states", &d.states, &a.states),
        ] {
            let want: Vec<String> = want.iter().map(show).collect();
            let got: Vec<String> = got.iter().map(show).collect();
            if want != got {
                problems.push(format!(
                    "function `{}`: the manifest declares {what} [{}], the package has [{}]",
                    d.name,
                    want.join(", "),
                    got.join(", ")
                ));
            }
        }
    }
    for a in actual {
        if !declared.iter().any(|d| d.name == a.name) {
            problems.push(format!("function `{}` is not in the manifest", a.name));
        }
    }
    problems
}
