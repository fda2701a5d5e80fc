//! NumPy `.npy` files of little-endian f32 (`<f4`, C order): logits dumps and oracle fixtures.

use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a supported .npy file: {problem}")]
    Format { path: PathBuf, problem: String },
    #[error("array of shape {shape:?} needs {expected} values, got {found}")]
    Length {
        shape: Vec<usize>,
        expected: usize,
        found: usize,
    },
}

/// An f32 array read from a `.npy` file.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Writes `data` with `shape` as a version 1.0 `.npy` file.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), NpyError> {
    let expected: usize = shape.iter().product();
    if expected != data.len() {
        return Err(NpyError::Length {
            shape: shape.to_vec(),
            expected,
            found: data.len(),
        });
    }
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Magic (6) + version (2) + header length (2) + header + '\n' is a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let io = |source| NpyError::Io {
        path: path.to_path_buf(),
        source,
    };
    // Written beside the target and renamed over it: a full disk or a crash never leaves a
    // truncated .npy where the old one (or nothing) was.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.as_deref().unwrap_or("npy"),
        std::process::id()
    ));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(io)
}

/// Reads a little-endian f32, C-order `.npy` file (versions 1–3).
pub fn read_f32(path: &Path) -> Result<NpyArray, NpyError> {
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_f32(&bytes).map_err(|problem| NpyError::Format {
        path: path.to_path_buf(),
        problem,
    })
}

fn parse_f32(bytes: &[u8]) -> Result<NpyArray, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("missing the \\x93NUMPY magic".into());
    }
    let (header_len, header_start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported version {v}")),
    };
    let data_start = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or("header runs past the end of the file")?;
    let header =
        std::str::from_utf8(&bytes[header_start..data_start]).map_err(|_| "header is not UTF-8")?;
    let field = |key: &str| -> Result<&str, String> {
        let at = header
            .find(&format!("'{key}'"))
            .ok_or(format!("header lacks '{key}'"))?;
        let rest = header[at + key.len() + 2..].trim_start();
        Ok(rest.strip_prefix(':').unwrap_or(rest).trim_start())
    };
    if !field("descr")?.starts_with("'<f4'") {
        return Err(format!("dtype is not '<f4' (header {header:?})"));
    }
    if !field("fortran_order")?.starts_with("False") {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    let shape_text = field("shape")?;
    let close = shape_text.find(')').ok_or("unterminated shape tuple")?;
    let shape = shape_text[1..close]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad dimension {s:?}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or("shape overflows")?;
    let payload = &bytes[data_start..];
    if payload.len() != numel * 4 {
        return Err(format!(
            "shape {shape:?} needs {} data bytes, file has {}",
            numel * 4,
            payload.len()
        ));
    }
    let data = payload
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(NpyArray { shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 1.0).collect();
        write_f32(&path, &[3, 4], &data).unwrap();
        let back = read_f32(&path).unwrap();
        assert_eq!(back.shape, vec![3, 4]);
        assert_eq!(back.data, data);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!((bytes.len() - 48) % 64, 0, "header padded to 64 bytes");
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(read_f32(&path), Err(NpyError::Format { .. })));
        write_f32(&path, &[5], &data[..5]).unwrap();
        assert_eq!(read_f32(&path).unwrap().shape, vec![5]);
        assert!(write_f32(&path, &[2, 2], &data).is_err());
    }
}

#[cfg(test)]
mod atomic_write_tests {
    use super::*;

    #[test]
    fn a_write_leaves_only_the_file_and_a_failed_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logits.npy");
        write_f32(&path, &[2], &[1.0, 2.0]).unwrap();
        write_f32(&path, &[3], &[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(read_f32(&path).unwrap().data, [1.0, 2.0, 3.0]);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "temp files left: {names:?}");
        // a directory in the way: the rename fails, the temp file goes
        let blocked = dir.path().join("blocked.npy");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), b"").unwrap();
        assert!(write_f32(&blocked, &[1], &[1.0]).is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2, "temp files left: {names:?}");
    }
}
