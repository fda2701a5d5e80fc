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

/// Hashes every file of the bundle and compares with the manifest: missing, changed and
/// unlisted files all fail.
pub fn verify_files(dir: &Path, manifest: &Manifest) -> Result<Vec<FileCheck>, BundleError> {
    let mut found = BTreeMap::new();
    hash_tree(dir, dir, &BTreeMap::new(), &mut found)?;
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
    Ok(checks)
}

/// sha256 of every regular file under `dir` except the manifest, keyed by its `/`-separated
/// path relative to `root`; files in `known` (by path, size checked) are not read again.
pub(crate) fn hash_tree(
    root: &Path,
    dir: &Path,
    known: &BTreeMap<PathBuf, FileHash>,
    out: &mut BTreeMap<String, FileHash>,
) -> Result<(), BundleError> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(io(dir))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io(dir))?;
    entries.sort();
    for path in entries {
        let meta = fs::symlink_metadata(&path).map_err(io(&path))?;
        if meta.is_dir() {
            hash_tree(root, &path, known, out)?;
        } else if meta.is_file() {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            if rel == MANIFEST_FILE {
                continue;
            }
            let hash = match known.get(&path) {
                Some(k) if k.bytes == meta.len() => k.clone(),
                _ => {
                    let h = anemone_checkpoint::hash_file(&path)?;
                    FileHash {
                        sha256: h.sha256,
                        bytes: h.bytes,
                    }
                }
            };
            out.insert(rel, hash);
        }
    }
    Ok(())
}
