//! `weight.bin` (MILBlob storage v2): a 64-byte header `{u32 count, u32 version = 2, 0…}`, then
//! per blob a 64-aligned 64-byte record `{u32 0xDEADBEEF, u32 dtype, u64 size_bytes,
//! u64 data_offset, u64 padding_bits, 0…}` followed by its data. A `blobFileValue.offset`
//! points at the record. The file ends right after the last blob's data.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::{Seek, SeekFrom, Write};

use crate::error::{MilError, Result};
use crate::ir::bytes::SharedBytes;
use crate::ir::tensor::TensorData;
use crate::ir::types::DType;

pub const BLOB_SENTINEL: u32 = 0xDEAD_BEEF;
pub const BLOB_VERSION: u32 = 2;
const HEADER_LEN: u64 = 64;
const RECORD_LEN: u64 = 64;
const ALIGN: u64 = 64;

/// The blob dtype code of an element type, if it may live in a blob.
pub fn blob_dtype_code(dtype: DType) -> Option<u32> {
    Some(match dtype {
        DType::F16 => 1,
        DType::F32 => 2,
        DType::U8 => 3,
        DType::I8 => 4,
        DType::I4 => 8,
        DType::U1 => 9,
        DType::U2 => 10,
        DType::U4 => 11,
        DType::U3 => 12,
        DType::U6 => 13,
        DType::I32 => 14,
        DType::Bool => return None,
    })
}

pub fn dtype_from_blob_code(code: u32) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|d| blob_dtype_code(*d) == Some(code))
}

/// Streams blobs into a seekable writer, writing identical data once.
pub struct BlobWriter<W: Write + Seek> {
    out: W,
    file: String,
    /// End of the data written so far (the next record starts at the next 64-byte boundary).
    end: u64,
    count: u32,
    written: HashMap<u64, Vec<(TensorData, u64)>>,
    unique_bytes: u64,
}

fn write_err(file: &str) -> impl Fn(std::io::Error) -> MilError + '_ {
    move |e| MilError::Blob {
        file: file.to_string(),
        detail: format!("write failed: {e}"),
    }
}

fn content_key(t: &TensorData) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.dtype().hash(&mut h);
    t.bytes().hash(&mut h);
    h.finish()
}

impl<W: Write + Seek> BlobWriter<W> {
    /// Starts a blob file; `file` names it in errors.
    pub fn new(mut out: W, file: &str) -> Result<Self> {
        let io = write_err(file);
        out.seek(SeekFrom::Start(0)).map_err(&io)?;
        out.write_all(&[0u8; HEADER_LEN as usize]).map_err(&io)?;
        Ok(BlobWriter {
            out,
            file: file.to_string(),
            end: HEADER_LEN,
            count: 0,
            written: HashMap::new(),
            unique_bytes: 0,
        })
    }

    /// Appends `data` (or finds an identical earlier blob) and returns its record offset.
    pub fn add(&mut self, data: &TensorData) -> Result<u64> {
        let Some(code) = blob_dtype_code(data.dtype()) else {
            return Err(MilError::Blob {
                file: self.file.clone(),
                detail: format!("{} cannot be stored in a blob", data.tensor_type()),
            });
        };
        let key = content_key(data);
        if let Some(found) = self.written.get(&key).and_then(|c| {
            c.iter()
                .find(|(t, _)| t.dtype() == data.dtype() && t.bytes() == data.bytes())
                .map(|(_, off)| *off)
        }) {
            return Ok(found);
        }
        let record = self.end.next_multiple_of(ALIGN);
        let data_offset = record + RECORD_LEN;
        let bits = (data.numel() * data.dtype().bits()) as u64;
        let padding_bits = (8 - bits % 8) % 8;
        let mut rec = [0u8; RECORD_LEN as usize];
        rec[0..4].copy_from_slice(&BLOB_SENTINEL.to_le_bytes());
        rec[4..8].copy_from_slice(&code.to_le_bytes());
        rec[8..16].copy_from_slice(&(data.bytes().len() as u64).to_le_bytes());
        rec[16..24].copy_from_slice(&data_offset.to_le_bytes());
        rec[24..32].copy_from_slice(&padding_bits.to_le_bytes());
        let gap = (record - self.end) as usize;
        let io = write_err(&self.file);
        self.out
            .write_all(&[0u8; ALIGN as usize][..gap])
            .map_err(&io)?;
        self.out.write_all(&rec).map_err(&io)?;
        self.out.write_all(data.bytes()).map_err(&io)?;
        self.end = data_offset + data.bytes().len() as u64;
        self.count += 1;
        self.unique_bytes += data.bytes().len() as u64;
        self.written
            .entry(key)
            .or_default()
            .push((data.clone(), record));
        Ok(record)
    }

    /// Number of distinct blobs written.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Payload bytes of distinct blobs.
    pub fn unique_bytes(&self) -> u64 {
        self.unique_bytes
    }

    /// Patches the header's blob count and returns the writer.
    pub fn finish(mut self) -> Result<W> {
        let mut hdr = [0u8; 8];
        hdr[0..4].copy_from_slice(&self.count.to_le_bytes());
        hdr[4..8].copy_from_slice(&BLOB_VERSION.to_le_bytes());
        let io = write_err(&self.file);
        self.out.seek(SeekFrom::Start(0)).map_err(&io)?;
        self.out.write_all(&hdr).map_err(&io)?;
        self.out.seek(SeekFrom::Start(self.end)).map_err(&io)?;
        self.out.flush().map_err(&io)?;
        Ok(self.out)
    }
}

/// One blob record as found in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobRecord {
    pub offset: u64,
    pub dtype: DType,
    pub size_bytes: u64,
    pub data_offset: u64,
    pub padding_bits: u64,
}

/// A whole weight.bin (in memory or mapped), with every record indexed and bounds-checked.
pub struct BlobFile {
    file: String,
    bytes: SharedBytes,
    records: Vec<BlobRecord>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl BlobFile {
    /// Parses and checks a blob file: header, sentinels, alignment, bounds, dtypes.
    pub fn parse(file: &str, bytes: impl Into<SharedBytes>) -> Result<Self> {
        let bytes: SharedBytes = bytes.into();
        let bad = |detail: String| MilError::Blob {
            file: file.to_string(),
            detail,
        };
        if bytes.len() < HEADER_LEN as usize {
            return Err(bad(format!(
                "{} bytes is shorter than the 64-byte header",
                bytes.len()
            )));
        }
        let count = u32_at(&bytes, 0);
        let version = u32_at(&bytes, 4);
        if version != BLOB_VERSION {
            return Err(bad(format!(
                "header version {version}, expected {BLOB_VERSION}"
            )));
        }
        let mut records = Vec::with_capacity(count.min(1 << 20) as usize);
        let mut off = HEADER_LEN;
        let len = bytes.len() as u64;
        for i in 0..count {
            off = off.next_multiple_of(ALIGN);
            if off.checked_add(RECORD_LEN).is_none_or(|e| e > len) {
                return Err(bad(format!("header says {count} blobs but record {i} at offset {off} is past the end ({len})")));
            }
            let at = off as usize;
            let sentinel = u32_at(&bytes, at);
            if sentinel != BLOB_SENTINEL {
                return Err(bad(format!(
                    "record {i} at offset {off}: sentinel 0x{sentinel:08X}, expected 0xDEADBEEF"
                )));
            }
            let code = u32_at(&bytes, at + 4);
            let dtype = dtype_from_blob_code(code).ok_or_else(|| {
                bad(format!(
                    "record {i} at offset {off}: unsupported dtype code {code}"
                ))
            })?;
            let size_bytes = u64_at(&bytes, at + 8);
            let data_offset = u64_at(&bytes, at + 16);
            let padding_bits = u64_at(&bytes, at + 24);
            let data_end = data_offset.checked_add(size_bytes);
            if data_offset < off + RECORD_LEN || data_end.is_none_or(|e| e > len) {
                return Err(bad(format!(
                    "record {i} at offset {off}: data [{data_offset}, +{size_bytes}) lies outside the file ({len} bytes)"
                )));
            }
            if padding_bits >= 8 {
                return Err(bad(format!(
                    "record {i} at offset {off}: padding_bits {padding_bits} >= 8"
                )));
            }
            records.push(BlobRecord {
                offset: off,
                dtype,
                size_bytes,
                data_offset,
                padding_bits,
            });
            off = data_offset + size_bytes;
        }
        Ok(BlobFile {
            file: file.to_string(),
            bytes,
            records,
        })
    }

    pub fn records(&self) -> &[BlobRecord] {
        &self.records
    }

    pub fn record(&self, offset: u64) -> Option<&BlobRecord> {
        self.records
            .binary_search_by_key(&offset, |r| r.offset)
            .ok()
            .map(|i| &self.records[i])
    }

    /// The tensor stored at record `offset`, checked against the declared dtype and shape.
    pub fn tensor(&self, offset: u64, dtype: DType, shape: &[usize]) -> Result<TensorData> {
        let bad = |detail: String| MilError::Blob {
            file: self.file.clone(),
            detail,
        };
        let rec = self.record(offset).ok_or_else(|| {
            bad(format!(
                "offset {offset} is not the offset of a blob record"
            ))
        })?;
        if rec.dtype != dtype {
            return Err(bad(format!(
                "blob at offset {offset} holds {}, declared {dtype}",
                rec.dtype
            )));
        }
        let numel: usize = shape.iter().product();
        let want = dtype.packed_len(numel) as u64;
        if rec.size_bytes != want {
            return Err(bad(format!(
                "blob at offset {offset} has {} bytes, {dtype} {shape:?} needs {want}",
                rec.size_bytes
            )));
        }
        let start = rec.data_offset as usize;
        let data = self
            .bytes
            .slice(start..start + rec.size_bytes as usize)
            .ok_or_else(|| bad(format!("blob at offset {offset} lies outside the file")))?;
        TensorData::from_bytes(dtype, shape.to_vec(), data)
    }
}
