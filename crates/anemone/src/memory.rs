//! Giving heap memory the process no longer needs back to the OS once a model is loaded
//! (glibc on Linux; a no-op elsewhere).

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
