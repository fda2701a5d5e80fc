//! Giving memory the process no longer needs back to the OS once a model is loaded (Linux; a
//! no-op elsewhere).

/// Gives heap memory freed by now back to the OS. glibc returns only the free space at the top
/// of its heap: megabytes of small blocks freed below live ones (a dropped tokenizer) would
/// stay resident for the rest of the run.
pub(crate) fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own free lists, under its arena locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Unmaps this executable's code pages from the process, once loading is done. Each page of
/// code that ran (argument parsing, JSON, the tokenizer, reading and preparing the packages)
/// stayed mapped, and the kernel maps up to 64 KiB of cached neighbours around every page it
/// faults in: ~8 MiB of the binary's 16 MiB of code counted as resident while generating, of
/// which decoding runs a small part. Unmapped pages stay in the page cache; what runs again
/// is mapped back on its next use (a minor fault, no read). Returns the bytes of code unmapped.
pub(crate) fn release_loader_code() -> usize {
    #[cfg(target_os = "linux")]
    {
        let Some(exe) = std::fs::read_link("/proc/self/exe")
            .ok()
            .and_then(|p| p.to_str().map(str::to_owned))
        else {
            return 0;
        };
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return 0;
        };
        let mut released = 0;
        for (start, end) in maps.lines().filter_map(|line| code_range(line, &exe)) {
            // SAFETY: [start, end) is a whole mapping of the running executable with
            // permissions r-xp: private, never writable (the code of a position-independent
            // executable has no relocations) and so never copied on write, and its file
            // cannot be written while it runs (ETXTBSY). Dropping its page-table entries
            // therefore changes no byte the process reads: the next access maps the same
            // page of the file again. No Rust reference covers these bytes.
            let status = unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED)
            };
            if status == 0 {
                released += end - start;
            }
        }
        released
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// The address range of a `/proc/self/maps` line when it maps code (`r-xp`) of the file `exe`.
#[cfg(any(target_os = "linux", test))]
fn code_range(line: &str, exe: &str) -> Option<(usize, usize)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    if perms != "r-xp" || !line.ends_with(exe) || line.ends_with(" (deleted)") {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (start < end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_executables_code_mappings_are_chosen() {
        let exe = "/usr/bin/an emone";
        let line = |perms: &str, path: &str| {
            format!("5f00a000-5f10b000 {perms} 00001000 08:01 1234                       {path}")
        };
        assert_eq!(
            code_range(&line("r-xp", exe), exe),
            Some((0x5f00a000, 0x5f10b000))
        );
        for (perms, path) in [
            ("r--p", exe), // read-only data (and relocated data after RELRO)
            ("rw-p", exe), // written data
            ("rwxp", exe), // writable code: may have been written
            ("r-xp", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            ("r-xp", "/usr/bin/emone"),
            ("r-xp", ""),
        ] {
            assert_eq!(code_range(&line(perms, path), exe), None, "{perms} {path}");
        }
        let deleted = format!("{} (deleted)", line("r-xp", exe));
        assert_eq!(code_range(&deleted, exe), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn code_released_runs_again() {
        fn work(n: u64) -> u64 {
            (0..n).fold(0u64, |a, i| a.wrapping_mul(31).wrapping_add(i ^ (a >> 7)))
        }
        /// Resident pages mapped from files (`RssFile` of /proc/self/status), in KiB.
        fn rss_file_kib() -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        }
        let before = work(10_000);
        let resident = rss_file_kib();
        assert!(
            release_loader_code() > 0,
            "this test binary has code mappings"
        );
        let after = rss_file_kib();
        assert!(after + 256 < resident, "{resident} KiB -> {after} KiB");
        assert_eq!(work(10_000), before);
    }
}
