//! The compiled-model cache: `<root>/<content key of the package>.mlmodelc`, filled atomically (a
//! compiled model is copied into a temporary directory beside its final name and renamed into
//! place, so a reader never sees half of one and two writers never mix theirs).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::CoreMlError;

/// `$ANEMONE_COREML_CACHE`, else the user cache directory (`~/Library/Caches` on macOS,
/// `$XDG_CACHE_HOME` or `~/.cache` elsewhere) + `anemone/coreml`.
pub fn default_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("ANEMONE_COREML_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let base = if cfg!(target_vendor = "apple") {
        home.map(|h| h.join("Library/Caches"))
    } else {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| home.map(|h| h.join(".cache")))
    };
    base.unwrap_or_else(std::env::temp_dir)
        .join("anemone")
        .join("coreml")
}

/// The content key of a package: sha256 over `path\0sha256\n` of each of its files, in path
/// order (paths relative to the package, `/`-separated; sha256 in lower-case hex). Built from
/// file hashes, so the same key comes from hashing the files ([`package_hash`]) or from a bundle
/// manifest that already lists them ([`content_key_under`]). Equal packages share one compiled
/// model wherever they sit.
pub fn content_key<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut files: Vec<(&str, &str)> = files.into_iter().collect();
    files.sort_unstable();
    let mut hasher = Sha256::new();
    for (path, sha256) in files {
        hasher.update(path.as_bytes());
        hasher.update([0u8]);
        hasher.update(sha256.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// The content key of the package at `package` (a path relative to the bundle, `/`-separated)
/// from a table of the bundle's files and their sha256s: the entries under `package/`. `None`
/// when the table lists none (then the package must be hashed).
pub fn content_key_under<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a str)>,
    package: &str,
) -> Option<String> {
    let prefix = format!("{}/", package.trim_end_matches('/'));
    let inside: Vec<(&str, &str)> = files
        .into_iter()
        .filter_map(|(path, sha)| path.strip_prefix(prefix.as_str()).map(|rel| (rel, sha)))
        .collect();
    (!inside.is_empty()).then(|| content_key(inside))
}

/// The content key of a package read from disk: every file hashed, then [`content_key`].
pub fn package_hash(package: &Path) -> Result<String, CoreMlError> {
    let read_err = |source| CoreMlError::Read {
        package: package.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    collect(package, package, &mut files).map_err(read_err)?;
    let mut hashed = Vec::with_capacity(files.len());
    let mut buf = vec![0u8; 1 << 20];
    for rel in files {
        let mut hasher = Sha256::new();
        let mut f = fs::File::open(package.join(&rel)).map_err(read_err)?;
        loop {
            let n = f.read(&mut buf).map_err(read_err)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        hashed.push((rel, hex::encode(hasher.finalize())));
    }
    Ok(content_key(
        hashed.iter().map(|(p, h)| (p.as_str(), h.as_str())),
    ))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect(root, &path, out)?;
        } else {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push(parts.join("/"));
        }
    }
    Ok(())
}

/// Where the compiled model of a package with `hash` lives under `root`.
pub fn compiled_path(root: &Path, hash: &str) -> PathBuf {
    root.join(format!("{hash}.mlmodelc"))
}

/// Copies the compiled model `from` to `dest` atomically: into a temporary sibling first, then
/// one rename. When another writer got there first, its copy is kept and ours removed.
pub fn install(package: &Path, from: &Path, dest: &Path) -> Result<(), CoreMlError> {
    let cache_err = |path: &Path, source| CoreMlError::Cache {
        package: package.to_path_buf(),
        path: path.to_path_buf(),
        source,
    };
    let parent = dest.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(|e| cache_err(parent, e))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let staging = parent.join(format!(".{name}.partial-{}", std::process::id()));
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| cache_err(&staging, e))?;
    }
    copy_dir(from, &staging).map_err(|e| cache_err(&staging, e))?;
    match fs::rename(&staging, dest) {
        Ok(()) => Ok(()),
        Err(_) if dest.is_dir() => {
            // another process installed the same content first
            fs::remove_dir_all(&staging).map_err(|e| cache_err(&staging, e))
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(cache_err(dest, e))
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn package(dir: &Path, weight: &[u8]) {
        fs::create_dir_all(dir.join("Data/weights")).unwrap();
        fs::write(dir.join("Manifest.json"), b"{}").unwrap();
        fs::write(dir.join("Data/weights/weight.bin"), weight).unwrap();
    }

    #[test]
    fn the_hash_follows_the_content_not_the_location() {
        let tmp = tempfile::tempdir().unwrap();
        package(&tmp.path().join("a.mlpackage"), b"1234");
        package(&tmp.path().join("b.mlpackage"), b"1234");
        package(&tmp.path().join("c.mlpackage"), b"1235");
        let h = |n: &str| package_hash(&tmp.path().join(n)).unwrap();
        assert_eq!(h("a.mlpackage"), h("b.mlpackage"));
        assert_ne!(h("a.mlpackage"), h("c.mlpackage"));
        assert_eq!(h("a.mlpackage").len(), 64);
        let err = package_hash(&tmp.path().join("missing.mlpackage")).unwrap_err();
        assert!(err.to_string().contains("missing.mlpackage"), "{err}");
    }

    #[test]
    fn a_manifest_gives_the_key_hashing_the_files_gives() {
        let tmp = tempfile::tempdir().unwrap();
        let bundle = tmp.path();
        package(&bundle.join("chunks/c0.mlpackage"), b"1234");
        package(&bundle.join("chunks/c1.mlpackage"), b"5678");
        // the manifest's table: every file of the bundle by relative path
        let sha = |p: &str| hex::encode(Sha256::digest(fs::read(bundle.join(p)).unwrap()));
        let paths = [
            "chunks/c0.mlpackage/Manifest.json",
            "chunks/c0.mlpackage/Data/weights/weight.bin",
            "chunks/c1.mlpackage/Manifest.json",
            "chunks/c1.mlpackage/Data/weights/weight.bin",
            "tokenizer.json",
        ];
        let table: Vec<(String, String)> = paths
            .iter()
            .map(|p| {
                // a file outside every package (not on disk here: its hash is never read)
                let hash = if *p == "tokenizer.json" {
                    "0".repeat(64)
                } else {
                    sha(p)
                };
                (p.to_string(), hash)
            })
            .collect();
        let rows = || table.iter().map(|(p, h)| (p.as_str(), h.as_str()));
        for name in ["chunks/c0.mlpackage", "chunks/c1.mlpackage"] {
            assert_eq!(
                content_key_under(rows(), name).unwrap(),
                package_hash(&bundle.join(name)).unwrap(),
                "{name}"
            );
        }
        assert_ne!(
            content_key_under(rows(), "chunks/c0.mlpackage"),
            content_key_under(rows(), "chunks/c1.mlpackage")
        );
        // a prefix of another package's name does not match it; an unlisted package has no key
        assert_eq!(content_key_under(rows(), "chunks/c"), None);
        assert_eq!(content_key_under(rows(), "chunks/c2.mlpackage"), None);
        // a changed file hash changes the key
        let mut edited = table.clone();
        edited[1].1 = "f".repeat(64);
        assert_ne!(
            content_key_under(
                edited.iter().map(|(p, h)| (p.as_str(), h.as_str())),
                "chunks/c0.mlpackage"
            ),
            content_key_under(rows(), "chunks/c0.mlpackage")
        );
    }

    #[test]
    fn install_is_whole_or_nothing_and_keeps_the_first_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let compiled = tmp.path().join("build.mlmodelc");
        package(&compiled, b"compiled");
        let dest = compiled_path(&tmp.path().join("cache"), "abc");
        install(Path::new("p.mlpackage"), &compiled, &dest).unwrap();
        assert_eq!(
            fs::read(dest.join("Data/weights/weight.bin")).unwrap(),
            b"compiled"
        );
        // a second writer of the same content leaves the first copy and no partial behind
        install(Path::new("p.mlpackage"), &compiled, &dest).unwrap();
        let names: Vec<String> = fs::read_dir(dest.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["abc.mlmodelc"]);
    }
}
