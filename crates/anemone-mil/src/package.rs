//! `.mlpackage` directories: `Manifest.json`, `Data/com.apple.CoreML/model.mlmodel` and
//! `Data/com.apple.CoreML/weights/weight.bin`. Writes are deterministic (UUIDs derived from
//! content) and atomic (built beside the target under a writer lock, then swapped in); an
//! existing package is kept unless overwriting is asked for, and then only a package is replaced.

use std::collections::HashMap;
use std::fs;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::blob::{BlobFile, BlobWriter};
use crate::error::{io_err, MilError, Result};
use crate::ir::program::Program;
use crate::read::read_model_proto;
use crate::staging::{ReplacePolicy, Staging};
use crate::write::write_model_with_blob;

const MODEL_REL: &str = "Data/com.apple.CoreML/model.mlmodel";
const WEIGHTS_DIR_REL: &str = "Data/com.apple.CoreML/weights";
const WEIGHT_FILE: &str = "weight.bin";

/// How to write a package.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    /// Replace an existing package at the destination.
    pub overwrite: bool,
}

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackageSummary {
    pub path: PathBuf,
    pub model_bytes: u64,
    pub weight_bytes: u64,
    /// Distinct blobs in weight.bin (shared weights count once).
    pub blob_count: u32,
    pub model_sha256: String,
    pub weights_sha256: String,
}

/// A UUID-formatted identifier derived from a label and content hash (version 5 layout).
fn derived_uuid(label: &str, content_sha256: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"anemone-mlpackage\0");
    h.update(label.as_bytes());
    h.update(b"\0");
    h.update(content_sha256.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    b[6] = (b[6] & 0x0F) | 0x50;
    b[8] = (b[8] & 0x3F) | 0x80;
    let x = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

fn manifest_json(model_id: &str, weights_id: &str) -> String {
    // Written by hand so the bytes never depend on a JSON library's map ordering.
    let mut entries = [
        (
            weights_id,
            "CoreML Model Weights",
            "weights",
            "com.apple.CoreML/weights",
        ),
        (
            model_id,
            "CoreML Model Specification",
            "model.mlmodel",
            "com.apple.CoreML/model.mlmodel",
        ),
    ];
    entries.sort_by(|a, b| a.0.cmp(b.0));
    let items: Vec<String> = entries
        .iter()
        .map(|(id, desc, name, path)| {
            format!(
                "        \"{id}\": {{\n            \"author\": \"com.apple.CoreML\",\n            \"description\": \"{desc}\",\n            \"name\": \"{name}\",\n            \"path\": \"{path}\"\n        }}"
            )
        })
        .collect();
    format!(
        "{{\n    \"fileFormatVersion\": \"1.0.0\",\n    \"itemInfoEntries\": {{\n{}\n    }},\n    \"rootModelIdentifier\": \"{model_id}\"\n}}\n",
        items.join(",\n")
    )
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).map_err(io_err(path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(io_err(path))?;
    Ok(hex::encode(h.finalize()))
}

fn write_into(program: &Program, dir: &Path) -> Result<PackageSummary> {
    let weights_dir = dir.join(WEIGHTS_DIR_REL);
    fs::create_dir_all(&weights_dir).map_err(io_err(&weights_dir))?;
    let weight_path = weights_dir.join(WEIGHT_FILE);
    let file = fs::File::create(&weight_path).map_err(io_err(&weight_path))?;
    let mut blob = BlobWriter::new(BufWriter::new(file), &weight_path.display().to_string())?;
    let model = write_model_with_blob(program, &mut blob)?;
    let blob_count = blob.count();
    let out = blob.finish()?;
    out.into_inner()
        .map_err(|e| MilError::Io {
            path: weight_path.clone(),
            source: e.into_error(),
        })?
        .sync_all()
        .map_err(io_err(&weight_path))?;
    let model_path = dir.join(MODEL_REL);
    fs::write(&model_path, &model).map_err(io_err(&model_path))?;
    let model_sha256 = hex::encode(Sha256::digest(&model));
    let weights_sha256 = sha256_file(&weight_path)?;
    let manifest = manifest_json(
        &derived_uuid("model.mlmodel", &model_sha256),
        &derived_uuid("weights", &weights_sha256),
    );
    let manifest_path = dir.join("Manifest.json");
    fs::write(&manifest_path, manifest).map_err(io_err(&manifest_path))?;
    Ok(PackageSummary {
        path: dir.to_path_buf(),
        model_bytes: model.len() as u64,
        weight_bytes: fs::metadata(&weight_path)
            .map_err(io_err(&weight_path))?
            .len(),
        blob_count,
        model_sha256,
        weights_sha256,
    })
}

/// Whether `path` is a package anemone could have written: a directory with `Manifest.json`.
pub fn is_package_dir(path: &Path) -> bool {
    path.join("Manifest.json").is_file()
}

/// Verifies and writes `program` as an `.mlpackage` directory at `path`: built beside it under a
/// writer lock and swapped in whole ([`crate::staging`]). With `overwrite`, only a package
/// (a directory with `Manifest.json`) or an empty directory is replaced.
pub fn write_package(
    program: &Program,
    path: &Path,
    opts: &WriteOptions,
) -> Result<PackageSummary> {
    let policy = ReplacePolicy {
        force: opts.overwrite,
        is_ours: &is_package_dir,
        inputs: &[],
    };
    let staging = Staging::begin(path, &policy)?;
    // On an error the staging is dropped, which removes its partial directory.
    let mut summary = write_into(program, staging.path())?;
    staging.commit(&policy)?;
    summary.path = path.to_path_buf();
    Ok(summary)
}

/// Reads the package's manifest and returns (root model path, weights dir).
fn locate(path: &Path) -> Result<(PathBuf, PathBuf)> {
    let bad = |detail: String| MilError::Package {
        path: path.to_path_buf(),
        detail,
    };
    let manifest_path = path.join("Manifest.json");
    let text = fs::read_to_string(&manifest_path).map_err(io_err(&manifest_path))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("Manifest.json is not JSON: {e}")))?;
    let items = json
        .get("itemInfoEntries")
        .and_then(|v| v.as_object())
        .ok_or_else(|| bad("Manifest.json has no itemInfoEntries".into()))?;
    let root = json
        .get("rootModelIdentifier")
        .and_then(|v| v.as_str())
        .ok_or_else(|| bad("Manifest.json has no rootModelIdentifier".into()))?;
    let item_path = |id: &str| -> Option<PathBuf> {
        let p = items.get(id)?.get("path")?.as_str()?;
        // refuse paths escaping the package
        if Path::new(p)
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return None;
        }
        Some(path.join("Data").join(p))
    };
    let model = item_path(root)
        .ok_or_else(|| bad(format!("root model `{root}` has no valid path entry")))?;
    let weights = items
        .iter()
        .find(|(_, v)| v.get("name").and_then(|n| n.as_str()) == Some("weights"))
        .and_then(|(id, _)| item_path(id))
        .unwrap_or_else(|| model.parent().unwrap_or(path).join("weights"));
    Ok((model, weights))
}

/// The function interfaces (inputs, states, outputs) of an `.mlpackage`, from its model proto
/// alone: its weights are not read.
pub fn read_package_interface(path: &Path) -> Result<Vec<crate::FunctionInterface>> {
    let (model_path, _) = locate(path)?;
    let model = fs::read(&model_path).map_err(io_err(&model_path))?;
    crate::read_model_interface(&model_path.display().to_string(), &model)
}

/// A weight file's bytes for reading in place: the file mapped read-only, no copy, every page
/// resident, in huge pages where the kernel gives them ([`crate::huge_pages`]). An empty file
/// (which cannot be mapped) is read.
fn map_weights(path: &Path) -> Result<crate::SharedBytes> {
    let file = fs::File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    if len == 0 {
        return Ok(Vec::new().into());
    }
    let len = usize::try_from(len).map_err(|_| {
        io_err(path)(std::io::Error::other(
            "larger than this platform's address space",
        ))
    })?;
    // SAFETY: packages are never written in place — a writer stages a new package and renames
    // it over the old one (`staging`), which leaves a mapped file's inode unchanged.
    let map = unsafe { crate::huge_pages::map_resident(&file, len) }.map_err(io_err(path))?;
    Ok(crate::SharedBytes::mapped(std::sync::Arc::new(map)))
}

/// Reads an `.mlpackage` back into a [`Program`] with its weights mapped from disk.
pub fn read_package(path: &Path) -> Result<Program> {
    let (model_path, weights_dir) = locate(path)?;
    let model = fs::read(&model_path).map_err(io_err(&model_path))?;
    let mut blobs = HashMap::new();
    if weights_dir.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(&weights_dir)
            .map_err(io_err(&weights_dir))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "bin"))
            .collect();
        entries.sort();
        for p in entries {
            let bytes = map_weights(&p)?;
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            blobs.insert(name, BlobFile::parse(&p.display().to_string(), bytes)?);
        }
    }
    read_model_proto(&model_path.display().to_string(), &model, &blobs)
}
