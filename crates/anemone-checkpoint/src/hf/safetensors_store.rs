//! Memory-mapped safetensors files (one file or the shards of a `model.safetensors.index.json`)
//! as a [`TensorStore`]; F32, F16 and BF16 tensors are widened to f32 on load.
//!
//! The `safetensors` crate validates a header completely (JSON, contiguous offsets, byte sizes that
//! match dtype × shape, a data section that ends exactly at the end of the file); on top of that
//! this module checks the index: shard names that stay inside the directory, shards that exist,
//! tensors that are where the index says, and no tensor in two shards.

use crate::error::{CheckpointError, Result};
use crate::store::{TensorInfo, TensorStore};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Bytes of the little-endian u64 header length that starts every safetensors file.
const HEADER_LEN_BYTES: usize = 8;

struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// Where one tensor lives: its shard and byte range inside that shard's map.
#[derive(Debug, Clone)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// Tensors of one or more memory-mapped safetensors files.
pub struct SafetensorsStore {
    shards: Vec<Shard>,
    entries: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for SafetensorsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsStore")
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl SafetensorsStore {
    /// Opens one safetensors file.
    pub fn open_file(path: &Path) -> Result<Self> {
        let mut store = Self {
            shards: Vec::new(),
            entries: BTreeMap::new(),
        };
        store.add_shard(path)?;
        Ok(store)
    }

    /// Opens the shards named by a `model.safetensors.index.json`.
    pub fn open_index(index_path: &Path) -> Result<Self> {
        let weight_map = read_weight_map(index_path)?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut shard_names: Vec<&str> = weight_map.values().map(String::as_str).collect();
        shard_names.sort_unstable();
        shard_names.dedup();

        let mut store = Self {
            shards: Vec::new(),
            entries: BTreeMap::new(),
        };
        for name in shard_names {
            let shard_path = dir.join(name);
            if !shard_path.is_file() {
                return Err(CheckpointError::MissingFile {
                    path: index_path.to_path_buf(),
                    what: format!("shard `{name}` named in weight_map"),
                });
            }
            store.add_shard(&shard_path)?;
        }
        for (tensor, shard_name) in &weight_map {
            let found = store
                .entries
                .get(tensor)
                .map(|e| store.shards[e.shard].path.file_name() == Some(shard_name.as_ref()));
            if found != Some(true) {
                return Err(CheckpointError::Corrupt {
                    path: index_path.to_path_buf(),
                    format: "safetensors index",
                    problem: format!(
                        "weight_map puts tensor `{tensor}` in `{shard_name}`, which does not contain it"
                    ),
                });
            }
        }
        Ok(store)
    }

    /// The files this store reads.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.shards.iter().map(|s| s.path.clone()).collect()
    }

    fn add_shard(&mut self, path: &Path) -> Result<()> {
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is only read. A file truncated by another process while mapped can
        // still fault (SIGBUS); that is inherent to memory-mapping and accepted for checkpoints.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&map).map_err(|e| CheckpointError::Corrupt {
                path: path.to_path_buf(),
                format: "safetensors",
                problem: e.to_string(),
            })?;
        // read_metadata checked that the data section ends exactly at the end of the file and
        // that every tensor's offsets are contiguous and sized for its dtype and shape.
        let data_start = HEADER_LEN_BYTES + header_len;
        let shard = self.shards.len();
        for (name, info) in metadata.tensors() {
            let (start, end) = info.data_offsets;
            let entry = Entry {
                shard,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: data_start + start,
                end: data_start + end,
            };
            if entry.end > map.len() {
                return Err(CheckpointError::Corrupt {
                    path: path.to_path_buf(),
                    format: "safetensors",
                    problem: format!(
                        "tensor `{name}` ends at byte {} past the end of the file",
                        entry.end
                    ),
                });
            }
            if let Some(previous) = self.entries.get(&name) {
                return Err(CheckpointError::DuplicateTensor {
                    name,
                    first: self.shards[previous.shard].path.clone(),
                    second: path.to_path_buf(),
                });
            }
            self.entries.insert(name, entry);
        }
        self.shards.push(Shard {
            path: path.to_path_buf(),
            map,
        });
        Ok(())
    }
}

/// `weight_map` of an index file: tensor name → shard file name (a plain name in the same dir).
fn read_weight_map(index_path: &Path) -> Result<BTreeMap<String, String>> {
    let json = super::read_json(index_path)?;
    let bad = |problem: String| CheckpointError::BadField {
        path: index_path.to_path_buf(),
        field: "weight_map".into(),
        problem,
    };
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("missing or not an object".into()))?;
    let mut out = BTreeMap::new();
    for (tensor, shard) in map {
        let shard = shard
            .as_str()
            .ok_or_else(|| bad(format!("tensor `{tensor}`: shard is not a string")))?;
        let plain = Path::new(shard)
            .file_name()
            .is_some_and(|n| n == std::ffi::OsStr::new(shard));
        if !plain {
            return Err(bad(format!(
                "tensor `{tensor}`: shard `{shard}` is not a file name in the checkpoint directory"
            )));
        }
        out.insert(tensor.clone(), shard.to_string());
    }
    if out.is_empty() {
        return Err(bad("is empty".into()));
    }
    Ok(out)
}

impl TensorStore for SafetensorsStore {
    fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.entries.get(name).map(|e| TensorInfo {
            shape: e.shape.clone(),
            dtype: e.dtype.to_string(),
        })
    }

    fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor { name: name.into() })?;
        let shard = &self.shards[entry.shard];
        let corrupt = |problem: String| CheckpointError::Corrupt {
            path: shard.path.clone(),
            format: "safetensors",
            problem,
        };
        let bytes = shard
            .map
            .get(entry.start..entry.end)
            .ok_or_else(|| corrupt(format!("tensor `{name}` lies outside the file")))?;
        let numel: usize = entry.shape.iter().product();
        let float =
            FloatType::of(entry.dtype).ok_or_else(|| CheckpointError::UnsupportedDtype {
                path: shard.path.clone(),
                tensor: name.into(),
                dtype: entry.dtype.to_string(),
            })?;
        if bytes.len() != numel * float.width() {
            return Err(corrupt(format!(
                "tensor `{name}` has {} bytes, its shape {:?} needs {}",
                bytes.len(),
                entry.shape,
                numel * float.width()
            )));
        }
        Ok(float.widen(bytes))
    }
}

/// The on-disk float types `load_f32` widens.
#[derive(Debug, Clone, Copy)]
enum FloatType {
    F32,
    F16,
    BF16,
}

impl FloatType {
    fn of(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::F32 => Some(Self::F32),
            Dtype::F16 => Some(Self::F16),
            Dtype::BF16 => Some(Self::BF16),
            _ => None,
        }
    }

    fn width(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }

    /// Little-endian bytes (a whole number of elements) → f32.
    fn widen(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            Self::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Self::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
            Self::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32())
                .collect(),
        }
    }
}
