//! Weight files mapped so that the kernel holds them in transparent huge pages (Linux), unless
//! `ANEMONE_HUGE_PAGES=off` is in the environment. A single-token matvec streams every weight
//! once per token; in 4 KiB pages it misses the TLB on every page (under virtualisation each
//! miss is a two-level walk), which on the project's benchmark host cost fp16 and compressed
//! bundles 5–25% of their decode speed (`benches/read_bandwidth.sh`, README sessions 21–22).
//!
//! A file map is only as huge as the page cache under it: the kernel maps a 2 MiB piece of a
//! file with one page-table entry when its cached folio is a whole huge page (file systems with
//! large folios, as ext4 from Linux 6.16 and xfs), and it allocates such folios when a map
//! advised `MADV_HUGEPAGE` faults the file in from disk. A file already cached in small folios
//! (written by `convert`, copied, or read without the advice) stays small, so [`make_resident`]
//! looks at what it got (`FilePmdMapped` in `/proc/self/smaps`) and, if a file was resident in small
//! folios, evicts its clean pages and maps it again: read from disk once, in huge folios for
//! every later load and process. Nothing is copied: the pages are the page cache's, shared
//! between processes, and count as resident memory as any file map's would. All of it is
//! advice — a kernel or file system without huge folios gives 4 KiB pages, the same bytes read
//! the same way — and an eviction that gave no huge pages is not tried again in this process.
//!
//! Anonymous memory a caller fills itself (the fp32 reference's weights) is advised with
//! [`advise_anonymous`].

use std::fs::File;
use std::ops::Range;

/// Transparent huge pages' size on x86-64 and arm64 Linux with 4 KiB base pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// The system's base page size (`sysconf`; 4 KiB where it cannot tell): what `madvise` ranges
/// and `mincore` entries are counted in.
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        #[cfg(unix)]
        {
            // SAFETY: sysconf has no preconditions.
            let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
            if let Some(page) = usize::try_from(page).ok().filter(|p| p.is_power_of_two()) {
                return page;
            }
        }
        4096
    })
}

/// Whether maps ask for huge pages: on Linux unless `ANEMONE_HUGE_PAGES=off` (or `0`).
pub fn enabled() -> bool {
    cfg!(target_os = "linux")
        && !std::env::var("ANEMONE_HUGE_PAGES").is_ok_and(|v| v == "off" || v == "0")
}

/// The first `len` bytes of `file` mapped read-only, every page resident when this returns
/// (every weight is used; faulting pages in on first use would move the load into the first
/// prediction), in huge pages where the kernel gives them (see the module docs).
///
/// # Safety
/// The file must not be written while mapped (bundles and packages are replaced by renames,
/// never written in place).
pub unsafe fn map_resident(file: &File, len: usize) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the caller's contract.
    unsafe { make_resident(file, map(file, len)?, 0..len) }
}

/// The first `len` bytes of `file` mapped read-only, advised for huge pages ([`enabled`]),
/// nothing read yet: pages fault in as they are touched (or [`make_resident`]).
///
/// # Safety
/// As [`map_resident`].
pub unsafe fn map(file: &File, len: usize) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the caller's contract.
    let map = unsafe { memmap2::MmapOptions::new().len(len).map(file) }?;
    #[cfg(target_os = "linux")]
    if enabled() {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    Ok(map)
}

/// `map` (of `file`, made by [`map`]) with bytes `range` resident, in huge pages where the
/// kernel gives them: if they were cached in small folios, they are evicted and `file` mapped
/// again (the returned map; see the module docs).
///
/// # Safety
/// As [`map_resident`].
pub unsafe fn make_resident(
    file: &File,
    map: memmap2::Mmap,
    range: Range<usize>,
) -> std::io::Result<memmap2::Mmap> {
    #[cfg(target_os = "linux")]
    {
        let whole = linux::whole_huge_pages(&map, &range);
        if !enabled() || whole == 0 || linux::eviction_futile() {
            populate(&map, &range);
            return Ok(map);
        }
        let was_cached = linux::any_resident(&map, &range);
        populate(&map, &range);
        let before = linux::pmd_mapped(&map);
        if !was_cached || before.is_none_or(|b| b >= whole) {
            return Ok(map);
        }
        let len = map.len();
        drop(map);
        linux::evict(file, &range);
        // SAFETY: the caller's contract.
        let map = unsafe { self::map(file, len) }?;
        populate(&map, &range);
        let after = linux::pmd_mapped(&map);
        tracing::debug!(
            ?before,
            ?after,
            whole,
            "a weight file's page cache read again"
        );
        if after == Some(0) {
            linux::give_up_eviction();
        }
        Ok(map)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        populate(&map, &range);
        Ok(map)
    }
}

/// [`make_resident`], then the range's pages unmapped again (they stay in the page cache, in
/// huge folios where the kernel gave them, and fault back in when first read): for bytes read
/// only later, so that they count as resident memory from then on, not during what comes
/// first (a prefill's scratch).
///
/// # Safety
/// As [`map_resident`].
pub unsafe fn make_cached(
    file: &File,
    map: memmap2::Mmap,
    range: Range<usize>,
) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the caller's contract.
    let map = unsafe { make_resident(file, map, range.clone()) }?;
    let page = page_size();
    let start = range.start.next_multiple_of(page);
    let end = range.end / page * page;
    if end > start {
        // SAFETY: a read-only map of a file not written while mapped (the caller's contract):
        // dropped pages read back as the same bytes.
        let _ = unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }
    Ok(map)
}

/// Faults bytes `range` of `map` in.
fn populate(map: &memmap2::Mmap, range: &Range<usize>) {
    #[cfg(target_os = "linux")]
    {
        let first = range.start / page_size() * page_size();
        if map
            .advise_range(memmap2::Advice::PopulateRead, first, range.end - first)
            .is_ok()
        {
            return;
        }
    }
    // kernels before 5.14 and other systems: read a byte of each page
    for at in range
        .clone()
        .step_by(page_size())
        .chain(range.end.checked_sub(1))
    {
        // SAFETY: `at` is inside the map.
        unsafe { std::ptr::read_volatile(map.as_ptr().add(at)) };
    }
}

/// Advises bytes `range` of a writable anonymous map its caller is about to fill for huge
/// pages (when [`enabled`]), the whole 2 MiB pages inside it only (a partial one would make
/// zeros resident); the kernel then clears 2 MiB at a time as the pages are first written.
pub fn advise_anonymous(map: &memmap2::MmapMut, range: Range<usize>) {
    #[cfg(target_os = "linux")]
    if enabled() {
        let base = map.as_ptr() as usize;
        let start = (base + range.start).next_multiple_of(HUGE_PAGE) - base;
        let end = (base + range.end) / HUGE_PAGE * HUGE_PAGE - base;
        if end > start {
            let _ = map.advise_range(memmap2::Advice::HugePage, start, end - start);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (map, range);
}

#[cfg(target_os = "linux")]
mod linux {
    use std::ops::Range;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::HUGE_PAGE;

    /// Set once evicting a file's page cache gave it no huge pages: its file system cannot hold
    /// them, and evicting more files would only read them from disk again.
    static EVICTION_FUTILE: AtomicBool = AtomicBool::new(false);

    pub fn eviction_futile() -> bool {
        EVICTION_FUTILE.load(Ordering::Relaxed)
    }

    pub fn give_up_eviction() {
        EVICTION_FUTILE.store(true, Ordering::Relaxed);
    }

    /// Bytes of `range` that whole huge pages of `map` can cover (its 2 MiB-aligned pieces,
    /// when the map itself starts on a 2 MiB boundary; else none).
    pub fn whole_huge_pages(map: &memmap2::Mmap, range: &Range<usize>) -> usize {
        if !(map.as_ptr() as usize).is_multiple_of(HUGE_PAGE) {
            return 0;
        }
        let start = range.start.next_multiple_of(HUGE_PAGE);
        (range.end / HUGE_PAGE * HUGE_PAGE).saturating_sub(start)
    }

    /// Whether any page of `range` of `map` is in the page cache (`mincore`; `true` if it
    /// cannot tell).
    pub fn any_resident(map: &memmap2::Mmap, range: &Range<usize>) -> bool {
        let page = super::page_size();
        let first = range.start / page * page;
        let len = range.end - first;
        let mut flags = vec![0u8; len.div_ceil(page)];
        // SAFETY: `first..range.end` lies in the live map, `first` is page-aligned (the map is),
        // and `flags` holds one byte per page of it.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add(first) as *mut libc::c_void,
                len,
                flags.as_mut_ptr(),
            )
        };
        rc != 0 || flags.iter().any(|f| f & 1 != 0)
    }

    /// Drops the clean cached pages of bytes `range` of `file` (those no process maps), having
    /// written back any dirty ones. Advice: a refusal leaves the cache as it was.
    pub fn evict(file: &std::fs::File, range: &Range<usize>) {
        let _ = file.sync_data();
        let (Ok(offset), Ok(len)) = (i64::try_from(range.start), i64::try_from(range.len())) else {
            return;
        };
        // SAFETY: a valid descriptor; the advice touches no memory of this process.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
    }

    /// Bytes of `map` mapped by huge pages; `None` if `/proc/self/smaps` cannot tell.
    pub fn pmd_mapped(map: &memmap2::Mmap) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        super::pmd_mapped_in(&smaps, map.as_ptr() as usize)
    }
}

/// `FilePmdMapped` of the map starting at `addr` in the text of `/proc/<pid>/smaps`, in bytes.
#[cfg(any(target_os = "linux", test))]
fn pmd_mapped_in(smaps: &str, addr: usize) -> Option<usize> {
    let head = format!("{addr:08x}-");
    let lines = smaps.lines().skip_while(|l| !l.starts_with(&head)).skip(1);
    // the first header after ours (an address range) ends our entry
    let line = lines
        .take_while(|l| !l.split_whitespace().next().is_some_and(|w| w.contains('-')))
        .find(|l| l.starts_with("FilePmdMapped:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0c0000000-55d0c0200000 r--p 00000000 fd:00 123  /usr/bin/x
Size:               2048 kB
FilePmdMapped:         0 kB
7f0000000000-7f0000d80000 r--s 00000000 fd:00 456  /b/weight.bin
Size:              13824 kB
Rss:               13824 kB
FilePmdMapped:     12288 kB
Locked:                0 kB
7f0000e00000-7f0000e01000 rw-p 00000000 00:00 0
Size:                  4 kB
";

    #[test]
    fn reads_the_huge_mapped_bytes_of_one_map_only() {
        assert_eq!(pmd_mapped_in(SMAPS, 0x7f00_0000_0000), Some(12 << 20));
        assert_eq!(pmd_mapped_in(SMAPS, 0x55d0_c000_0000), Some(0));
        // an entry without the field does not borrow the next entry's
        assert_eq!(pmd_mapped_in(SMAPS, 0x7f00_00e0_0000), None);
        assert_eq!(pmd_mapped_in(SMAPS, 0x1000), None);
    }

    #[test]
    fn maps_hold_the_file_bytes_whichever_pages_the_kernel_gives() {
        let bytes: Vec<u8> = (0..3 * HUGE_PAGE + 12_345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let path = std::env::temp_dir().join(format!("anemone-huge-{}.bin", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        // SAFETY: the file is private to this test and not written while mapped.
        let whole = unsafe { map_resident(&file, bytes.len()) }.unwrap();
        let again = unsafe { map_resident(&file, bytes.len()) }.unwrap();
        let head = unsafe { map_resident(&file, 4097) }.unwrap();
        let lazy = unsafe { map(&file, bytes.len()) }.unwrap();
        let middle = HUGE_PAGE - 100..bytes.len() - 7;
        let part = unsafe { make_resident(&file, lazy, middle.clone()) }.unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&whole[..], &bytes[..]);
        assert_eq!(&again[..], &bytes[..]);
        assert_eq!(&head[..], &bytes[..4097]);
        assert_eq!(&part[middle.clone()], &bytes[middle]);
        assert_eq!(&part[..], &bytes[..]);
    }
}
