//! The GGUF container (v2, v3): header, metadata key/values, tensor infos, aligned data section.
//!
//! Every length, count and offset read from the file is checked against the bytes that remain
//! before it is used, so a lying or truncated header yields [`CheckpointError::Corrupt`], never a
//! panic, an out-of-bounds read or an allocation sized by an unchecked count.

use super::dequant::{type_name, GgmlType};
use super::metadata::{MetaValue, Metadata};
use crate::error::{CheckpointError, Result};
use memmap2::Mmap;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Display;
use std::path::{Path, PathBuf};

/// "GGUF" as stored in the first four bytes.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// ggml's limit on tensor rank.
pub const MAX_DIMS: u32 = 4;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Arrays nest at most this deep (real files use depth 1); deeper nesting is treated as corrupt
/// so a crafted file cannot exhaust the stack.
const MAX_ARRAY_DEPTH: usize = 4;

/// One tensor as the file describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    pub name: String,
    /// ggml `ne`: innermost (contiguous) dimension first.
    pub ne: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Start of the tensor's bytes, absolute in the file.
    pub start: usize,
    pub byte_len: usize,
}

impl TensorDesc {
    pub fn numel(&self) -> usize {
        // Bounded at parse time: numel · bytes/elem ≤ file length.
        self.ne.iter().product::<u64>() as usize
    }

    /// Shape in Hugging Face order (outermost first): the reverse of ggml's `ne`.
    pub fn hf_shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub alignment: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorDesc>,
    map: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.entries.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::NotFound {
                path: path.to_path_buf(),
            },
            _ => io(e),
        })?;
        // SAFETY: the map is read-only and private to this process; as with every memory-mapped
        // reader, the file must not be truncated by another process while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let parsed = parse(path, &map)?;
        Ok(Self {
            path: path.to_path_buf(),
            version: parsed.version,
            alignment: parsed.alignment,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            map,
        })
    }

    /// The bytes of a tensor (bounds were checked when the file was parsed).
    pub fn tensor_bytes(&self, t: &TensorDesc) -> &[u8] {
        &self.map[t.start..t.start + t.byte_len]
    }
}

/// The parsed header of a GGUF image.
#[derive(Debug)]
pub struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorDesc>,
}

/// Parses a whole GGUF image held in `bytes` (`path` only names it in errors).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed> {
    let mut c = Cursor {
        bytes,
        pos: 0,
        path,
    };
    let magic = c.take(4, "magic")?;
    if magic != MAGIC {
        return Err(c.corrupt(format!(
            "bad magic {magic:02x?} (expected \"GGUF\"); not a GGUF file"
        )));
    }
    let version = c.u32("version")?;
    if !(2..=3).contains(&version) {
        let hint = if (2..=3).contains(&version.swap_bytes()) {
            " (a big-endian file; only little-endian GGUF is supported)"
        } else {
            ""
        };
        return Err(c.corrupt(format!(
            "unsupported GGUF version {version} (supported: 2, 3){hint}"
        )));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
    // least 8 + 4 + 4 + 8. Counts beyond what the file can hold are lies.
    c.check_count(n_kv, 13, "metadata count")?;
    c.check_count(n_tensors, 24, "tensor count")?;

    let mut entries = BTreeMap::new();
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = c.u32("metadata value type")?;
        let value = c.value(ty, &key, 0)?;
        if entries.insert(key.clone(), value).is_some() {
            return Err(c.corrupt(format!("metadata key `{key}` appears twice")));
        }
    }
    let metadata = Metadata::new(path, entries);
    let alignment = match metadata.opt_u64("general.alignment")? {
        None => DEFAULT_ALIGNMENT,
        Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
        Some(a) => {
            return Err(metadata.bad(
                "general.alignment",
                format!("{a} is not a power of two between 1 and 2^20"),
            ))
        }
    };

    let mut infos = Vec::new();
    let mut names = HashSet::new();
    for _ in 0..n_tensors {
        let name = c.string("tensor name")?;
        let n_dims = c.u32("tensor rank")?;
        if n_dims > MAX_DIMS {
            return Err(c.corrupt(format!(
                "tensor `{name}` has rank {n_dims} (ggml allows at most {MAX_DIMS})"
            )));
        }
        let ne = (0..n_dims)
            .map(|_| c.u64("tensor dimension"))
            .collect::<Result<Vec<_>>>()?;
        let type_id = c.u32("tensor type")?;
        let offset = c.u64("tensor offset")?;
        if !names.insert(name.clone()) {
            return Err(c.corrupt(format!("tensor `{name}` appears twice")));
        }
        infos.push((name, ne, type_id, offset));
    }

    let data_start = align_up(c.pos as u64, alignment)
        .filter(|&s| s <= bytes.len() as u64)
        .ok_or_else(|| {
            c.corrupt(format!(
                "file ends ({} bytes) before its data section",
                bytes.len()
            ))
        })?;

    let mut tensors = Vec::with_capacity(infos.len());
    for (name, ne, type_id, offset) in infos {
        let ggml_type =
            GgmlType::from_id(type_id).ok_or_else(|| CheckpointError::UnsupportedDtype {
                path: path.to_path_buf(),
                tensor: name.clone(),
                dtype: type_name(type_id)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("ggml type id {type_id}")),
            })?;
        let numel = ne
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| {
                c.corrupt(format!(
                    "tensor `{name}` has dimensions {ne:?} whose product overflows"
                ))
            })?;
        let row = ne.first().copied().unwrap_or(1);
        if !row.is_multiple_of(ggml_type.block_len() as u64) {
            return Err(c.corrupt(format!(
                "tensor `{name}`: row length {row} is not a multiple of the {} block size {}",
                ggml_type.name(),
                ggml_type.block_len()
            )));
        }
        let byte_len = ggml_type
            .bytes_for(numel)
            .ok_or_else(|| c.corrupt(format!("tensor `{name}` is too large ({numel} elements)")))?;
        if !offset.is_multiple_of(alignment) {
            return Err(c.corrupt(format!(
                "tensor `{name}` offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        let start = data_start.checked_add(offset);
        let end = start.and_then(|s| s.checked_add(byte_len));
        match (start, end) {
            (Some(start), Some(end)) if end <= bytes.len() as u64 => tensors.push(TensorDesc {
                name,
                ne,
                ggml_type,
                start: start as usize,
                byte_len: byte_len as usize,
            }),
            _ => {
                return Err(c.corrupt(format!(
                    "tensor `{name}` ({} {ne:?}, {byte_len} bytes at data offset {offset}) \
                     extends past the end of the file ({} bytes; data section starts at {data_start})",
                    ggml_type.name(),
                    bytes.len()
                )))
            }
        }
    }
    check_data_layout(&c, &tensors, data_start, alignment, bytes.len() as u64)?;
    Ok(Parsed {
        version,
        alignment,
        metadata,
        tensors,
    })
}

/// GGUF writers lay tensor data out back to back, each padded to the alignment. Overlapping
/// tensors are corrupt; a gap of an alignment or more after a tensor (or at the end of the
/// file) means its ggml type or shape disagrees with the bytes written for it, e.g. a changed
/// type id that happens to still fit in the file.
fn check_data_layout(
    c: &Cursor<'_>,
    tensors: &[TensorDesc],
    data_start: u64,
    alignment: u64,
    file_len: u64,
) -> Result<()> {
    let mut order: Vec<&TensorDesc> = tensors.iter().collect();
    order.sort_by_key(|t| (t.start, t.byte_len));
    let span = |t: &TensorDesc| {
        format!(
            "`{}` ({} {:?}, data bytes {}..{})",
            t.name,
            t.ggml_type.name(),
            t.ne,
            t.start as u64 - data_start,
            (t.start + t.byte_len) as u64 - data_start
        )
    };
    let size_disagrees = |t: &TensorDesc, gap: u64, next: &str| {
        c.corrupt(format!(
            "tensor {}: its type and shape give {} bytes, but {gap} unused bytes follow it              before {next}; the tensor's type or shape disagrees with its data",
            span(t),
            t.byte_len
        ))
    };
    if let Some(first) = order.first() {
        let lead = first.start as u64 - data_start;
        if lead >= alignment {
            return Err(c.corrupt(format!(
                "tensor {}: the data section's first {lead} bytes belong to no tensor",
                span(first)
            )));
        }
    }
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let a_end = (a.start + a.byte_len) as u64;
        if (b.start as u64) < a_end {
            return Err(c.corrupt(format!("tensor {} overlaps tensor {}", span(b), span(a))));
        }
        let gap = b.start as u64 - a_end;
        if gap >= alignment {
            return Err(size_disagrees(a, gap, &format!("tensor `{}`", b.name)));
        }
    }
    if let Some(last) = order.last() {
        let gap = file_len - (last.start + last.byte_len) as u64;
        if gap >= alignment {
            return Err(size_disagrees(last, gap, "the end of the file"));
        }
    }
    Ok(())
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    x.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn corrupt(&self, problem: String) -> CheckpointError {
        CheckpointError::Corrupt {
            path: self.path.to_path_buf(),
            format: "GGUF",
            problem,
        }
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: impl Display) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.corrupt(format!(
                "truncated: {what} at offset {} needs {n} bytes, {} remain",
                self.pos,
                self.remaining()
            )));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: impl Display) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: impl Display) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl Display) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in what remains.
    fn check_count(&self, count: u64, min_size: u64, what: impl Display) -> Result<()> {
        if count.saturating_mul(min_size) > self.remaining() as u64 {
            return Err(self.corrupt(format!(
                "{what} {count} at offset {} cannot fit in the {} bytes that remain",
                self.pos,
                self.remaining()
            )));
        }
        Ok(())
    }

    fn string(&mut self, what: impl Display + Copy) -> Result<String> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(self.corrupt(format!(
                "{what} at offset {at} claims {len} bytes, only {} remain",
                self.remaining()
            )));
        }
        let raw = self.take(len as usize, what)?;
        String::from_utf8(raw.to_vec())
            .map_err(|_| self.corrupt(format!("{what} at offset {at} is not valid UTF-8")))
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue> {
        let what = ValueOf(key);
        Ok(match ty {
            0 => MetaValue::U8(self.array::<1>(what)?[0]),
            1 => MetaValue::I8(self.array::<1>(what)?[0] as i8),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(what)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(self.corrupt(format!("{what} is a bool stored as {b}"))),
            },
            8 => MetaValue::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(
                        self.corrupt(format!("{what} nests arrays deeper than {MAX_ARRAY_DEPTH}"))
                    );
                }
                let elem = self.u32(what)?;
                let count = self.u64(what)?;
                let min_size = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    _ => {
                        return Err(self
                            .corrupt(format!("{what} is an array of unknown value type {elem}")))
                    }
                };
                self.check_count(count, min_size, ArrayCountOf(key))?;
                // Capacity grows with what is actually read, never with the claimed count alone.
                let mut items = Vec::with_capacity((count as usize).min(1 << 16));
                for _ in 0..count {
                    items.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::U64(u64::from_le_bytes(self.array(what)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            _ => {
                return Err(self.corrupt(format!(
                    "{what} has unknown value type {ty} (offset {})",
                    self.pos - 4
                )))
            }
        })
    }
}

/// "value of `key`", formatted only when an error needs it.
#[derive(Clone, Copy)]
struct ValueOf<'k>(&'k str);

impl Display for ValueOf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "value of `{}`", self.0)
    }
}

#[derive(Clone, Copy)]
struct ArrayCountOf<'k>(&'k str);

impl Display for ArrayCountOf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "array count of `{}`", self.0)
    }
}
