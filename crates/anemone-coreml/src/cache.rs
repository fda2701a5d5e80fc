//! The compiled-model cache: `<root>/<sha256 of the package>.mlmodelc`, filled atomically (a
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

/// The sha256 of a package's content: every file's path (relative, `/`-separated) and bytes, in
/// path order. Equal packages share one compiled model wherever they sit.
pub fn package_hash(package: &Path) -> Result<String, CoreMlError> {
    let read_err = |source| CoreMlError::Read {
        package: package.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    collect(package, package, &mut files).map_err(read_err)?;
    files.sort();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for rel in &files {
        hasher.update(rel.as_bytes());
        hasher.update([0u8]);
        let mut f = fs::File::open(package.join(rel)).map_err(read_err)?;
        loop {
            let n = f.read(&mut buf).map_err(read_err)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        hasher.update([0u8]);
    }
    Ok(hex::encode(hasher.finalize()))
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
