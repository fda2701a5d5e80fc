//! Read-only copies of weight bytes in memory the kernel is asked to back with transparent huge
//! pages (Linux), when `ANEMONE_HUGE_PAGES=on` is in the environment. A single-token matvec
//! streams every weight once per token; with 4 KiB pages it misses the TLB on every page (under
//! virtualisation each miss is a two-level walk), which on the project's benchmark host costs a
//! quarter to half of the read bandwidth (`benches/read_bandwidth.sh`) and 15–25% of an fp16
//! bundle's decode speed. It is not the default: the kernel clears every fresh page at load (on
//! a VM whose host faults them in cold, up to ≈ 1 s a GB), and the benchmark's peak resident
//! memory of small compressed bundles rose by ≈ 20 MiB (README, session 21). A copy starts at a
//! huge-page boundary of an anonymous map advised `MADV_HUGEPAGE` for its whole huge pages; the
//! advice is a hint (a kernel without transparent huge pages gives 4 KiB pages: the same bytes,
//! read the same way). Without a copy (the default, or another OS) the callers keep their file
//! maps.

use std::fs::File;
use std::ops::Range;
use std::sync::Arc;

use crate::SharedBytes;

/// Transparent huge pages' size on x86-64 and arm64 Linux with 4 KiB base pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// Whether copies are asked for: `ANEMONE_HUGE_PAGES=on` (or `1`).
pub fn enabled() -> bool {
    std::env::var("ANEMONE_HUGE_PAGES").is_ok_and(|v| v == "on" || v == "1")
}

/// A writable anonymous map advised for huge pages and the huge-page-aligned range of `len`
/// bytes in it; `None` where there is no such map (another OS, an address space too small, a
/// refused map).
fn aligned_map(len: usize) -> Option<(memmap2::MmapMut, Range<usize>)> {
    if !cfg!(target_os = "linux") || len == 0 {
        return None;
    }
    let span = len.checked_add(HUGE_PAGE)?;
    let map = memmap2::MmapMut::map_anon(span).ok()?;
    let base = map.as_ptr() as usize;
    let start = base.next_multiple_of(HUGE_PAGE) - base;
    // whole huge pages only: a tail in one would make up to 2 MiB of zeros resident
    let whole = len / HUGE_PAGE * HUGE_PAGE;
    #[cfg(target_os = "linux")]
    if whole > 0 {
        let _ = map.advise_range(memmap2::Advice::HugePage, start, whole);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = whole;
    Some((map, start..start + len))
}

/// Bytes of a read below which one thread reads it all.
const SPLIT_READ: usize = 16 << 20;

/// Bytes `offset..offset + len` of `file` in huge pages when they are asked for ([`enabled`],
/// see the module docs); `Ok(None)` where none are asked for or can be had, having read
/// nothing. The file's pages are read, not mapped, so they never count as resident memory.
pub fn read_file(file: &File, offset: u64, len: usize) -> std::io::Result<Option<SharedBytes>> {
    if !enabled() {
        return Ok(None);
    }
    copy_file(file, offset, len)
}

/// [`read_file`] whether asked for or not. A large file is read by a few threads side by side,
/// each a part: most of the cost is the kernel clearing the fresh pages, which a single reader
/// pays one page at a time.
pub fn copy_file(file: &File, offset: u64, len: usize) -> std::io::Result<Option<SharedBytes>> {
    let Some((mut map, range)) = aligned_map(len) else {
        return Ok(None);
    };
    let readers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
        .min(len.div_ceil(SPLIT_READ));
    let part = len.div_ceil(readers).next_multiple_of(HUGE_PAGE);
    std::thread::scope(|scope| {
        let parts: Vec<_> = map[range.clone()]
            .chunks_mut(part)
            .enumerate()
            .map(|(i, dst)| scope.spawn(move || read_at(file, dst, offset + (i * part) as u64)))
            .collect();
        parts
            .into_iter()
            .try_for_each(|p| p.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
    })?;
    let map = Arc::new(map.make_read_only()?);
    Ok(SharedBytes::anonymous(map, range))
}

/// Fills `dst` from `file` at `offset`.
fn read_at(file: &File, dst: &mut [u8], offset: u64) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, dst, offset)
    }
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek};
        let mut file = file;
        file.seek(std::io::SeekFrom::Start(offset))?;
        file.read_exact(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_hold_the_same_bytes_from_a_huge_page_boundary() {
        let bytes: Vec<u8> = (0..SPLIT_READ + 3 * HUGE_PAGE + 12_345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let path = std::env::temp_dir().join(format!("anemone-huge-{}.bin", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let read = copy_file(&file, 0, bytes.len()).unwrap();
        let part = copy_file(&file, 4097, bytes.len() - 4097 - 5).unwrap();
        std::fs::remove_file(&path).unwrap();
        if cfg!(target_os = "linux") {
            let read = read.expect("an anonymous map on Linux");
            assert_eq!(&read[..], &bytes[..]);
            assert_eq!(read.addr() % HUGE_PAGE, 0);
            let part = part.expect("an anonymous map on Linux");
            assert_eq!(&part[..], &bytes[4097..bytes.len() - 5]);
            // anonymous pages are never released (they would read back as zeros)
            read.release_pages();
            assert_eq!(&read[..], &bytes[..]);
        } else {
            assert!(read.is_none() && part.is_none());
        }
    }
}
