//! Writing a directory (an `.mlpackage`, a bundle) so that nobody ever sees half of it and
//! nothing of the user's is lost.
//!
//! Invariants:
//! - The output is built in `.NAME.anemone-partial` beside the target, by the one process that
//!   holds the lock `.NAME.anemone-lock` (`flock`, released by the kernel when its holder dies;
//!   the file holds the holder's pid for messages). A second writer of the same target fails
//!   cleanly while the first one runs. A partial directory found by the lock's holder is debris of
//!   a dead writer (kill -9, power loss) and is removed; [`remove_stale`] does the same for a
//!   whole directory (`anemone clean`, and every convert beside its output), including the
//!   `.NAME.tmp-PID` debris earlier versions left when killed.
//! - An existing target is replaced only when the caller says so (`--force`) **and** it is one
//!   of ours (the caller's `is_ours` test, e.g. a directory holding a bundle manifest) or an empty
//!   directory; never when an input lives inside it.
//! - Replacement is one atomic exchange of the two directories where the OS has one
//!   (`renameat2(RENAME_EXCHANGE)` on Linux, `renamex_np(RENAME_SWAP)` on macOS): a reader sees
//!   the old output or the new one, never neither.
//! - Partial directories of this process are listed in a registry so that a SIGINT/SIGTERM
//!   handler can remove them ([`remove_registered`]) before the process exits.
//!
//! Known limit: the lock file is removed when its holder finishes; a third writer racing that
//! exact moment could lock a fresh file while a second still holds the unlinked one.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const PARTIAL_SUFFIX: &str = ".anemone-partial";
const LOCK_SUFFIX: &str = ".anemone-lock";

/// Why an output could not be staged or put in place.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    #[error("{path}: already exists (pass --force to replace it)")]
    Exists { path: PathBuf },
    #[error(
        "{path}: not replaced: it is not an output of anemone ({what}); \
         remove it yourself or choose another output path"
    )]
    NotOurs { path: PathBuf, what: String },
    #[error("{path}: not replaced: the input {input} is inside it")]
    InputInside { path: PathBuf, input: PathBuf },
    #[error("{path}: another anemone process (pid {pid}) is writing it; wait for it or stop it")]
    Busy { path: PathBuf, pid: u32 },
    #[error("{path}: has no file name")]
    NoFileName { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StagingError + '_ {
    move |source| StagingError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What an existing target must be for `--force` to replace it.
pub struct ReplacePolicy<'a> {
    /// `--force` was given.
    pub force: bool,
    /// Whether an existing path is an output of ours (e.g. a directory with `anemone.json`).
    pub is_ours: &'a dyn Fn(&Path) -> bool,
    /// Files the output is made from; none may be inside the target.
    pub inputs: &'a [&'a Path],
}

/// An output directory being written. Dropped without [`Staging::commit`], its partial
/// directory is removed.
#[derive(Debug)]
pub struct Staging {
    target: PathBuf,
    partial: PathBuf,
    lock: WriterLock,
    committed: bool,
}

static REGISTRY: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn register(path: &Path) {
    if let Ok(mut list) = REGISTRY.lock() {
        list.push(path.to_path_buf());
    }
}

fn unregister(path: &Path) {
    if let Ok(mut list) = REGISTRY.lock() {
        list.retain(|p| p != path);
    }
}

/// Removes every partial directory this process is writing; for signal handlers, just before
/// the process exits. Returns the directories removed.
pub fn remove_registered() -> Vec<PathBuf> {
    let list = match REGISTRY.lock() {
        Ok(mut list) => std::mem::take(&mut *list),
        Err(_) => return Vec::new(),
    };
    list.into_iter()
        .filter(|p| {
            let removed = fs::remove_dir_all(p).is_ok();
            // The process exits next, which releases the lock; its file goes first.
            let _ = fs::remove_file(p.with_extension("anemone-lock"));
            removed
        })
        .collect()
}

fn split(target: &Path) -> Result<(PathBuf, String), StagingError> {
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .ok_or_else(|| StagingError::NoFileName {
            path: target.to_path_buf(),
        })?
        .to_string_lossy()
        .into_owned();
    Ok((parent, name))
}

/// The partial directory a writer of `target` uses.
pub fn partial_path(target: &Path) -> Result<PathBuf, StagingError> {
    let (parent, name) = split(target)?;
    Ok(parent.join(format!(".{name}{PARTIAL_SUFFIX}")))
}

fn lock_path(target: &Path) -> Result<PathBuf, StagingError> {
    let (parent, name) = split(target)?;
    Ok(parent.join(format!(".{name}{LOCK_SUFFIX}")))
}

impl Staging {
    /// Checks that `target` may be written under `policy`, takes the writer's lock and makes an
    /// empty partial directory to write into.
    pub fn begin(target: &Path, policy: &ReplacePolicy<'_>) -> Result<Self, StagingError> {
        let (parent, _) = split(target)?;
        fs::create_dir_all(&parent).map_err(io(&parent))?;
        check_replaceable(target, policy)?;
        let lock = WriterLock::acquire(&lock_path(target)?)?.map_err(|pid| StagingError::Busy {
            path: target.to_path_buf(),
            pid,
        })?;
        let partial = partial_path(target)?;
        if partial.symlink_metadata().is_ok() {
            tracing::warn!("removing {} left by an interrupted run", partial.display());
            fs::remove_dir_all(&partial).map_err(io(&partial))?;
        }
        fs::create_dir(&partial).map_err(io(&partial))?;
        register(&partial);
        Ok(Staging {
            target: target.to_path_buf(),
            partial,
            lock,
            committed: false,
        })
    }

    /// Where the output is written until [`Staging::commit`].
    pub fn path(&self) -> &Path {
        &self.partial
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Puts the finished output in place: one atomic exchange with an existing target (checked
    /// again under the lock), or a rename. The previous output is then removed.
    pub fn commit(mut self, policy: &ReplacePolicy<'_>) -> Result<PathBuf, StagingError> {
        if self.target.symlink_metadata().is_ok() {
            check_replaceable(&self.target, policy)?;
            exchange(&self.partial, &self.target)?;
            // `partial` now holds the previous output.
            fs::remove_dir_all(&self.partial).map_err(io(&self.partial))?;
        } else {
            fs::rename(&self.partial, &self.target).map_err(io(&self.target))?;
        }
        self.committed = true;
        unregister(&self.partial);
        Ok(self.target.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.partial);
            unregister(&self.partial);
        }
        self.lock.release();
    }
}

/// An exclusive `flock` on a writer's lock file, which holds the writer's pid.
#[derive(Debug)]
struct WriterLock {
    path: PathBuf,
    file: Option<fs::File>,
}

impl WriterLock {
    /// The lock, or `Err(pid)` of the process holding it.
    fn acquire(path: &Path) -> Result<Result<Self, u32>, StagingError> {
        use std::io::{Read, Seek, Write};
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io(path))?;
        if !try_lock(&file).map_err(io(path))? {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Ok(Err(holder.trim().parse().unwrap_or(0)));
        }
        file.set_len(0).map_err(io(path))?;
        file.rewind().map_err(io(path))?;
        write!(file, "{}", std::process::id()).map_err(io(path))?;
        Ok(Ok(WriterLock {
            path: path.to_path_buf(),
            file: Some(file),
        }))
    }

    /// Removes the lock file, then unlocks (closing the file).
    fn release(&mut self) {
        if let Some(file) = self.file.take() {
            let _ = fs::remove_file(&self.path);
            drop(file);
        }
    }
}

/// Whether a live process holds the lock at `path` (a missing file is not held).
fn lock_is_held(path: &Path) -> Result<bool, StagingError> {
    let file = match fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(path)(e)),
    };
    // Taken and dropped at once: closing the file releases it.
    Ok(!try_lock(&file).map_err(io(path))?)
}

/// Takes an exclusive lock without waiting; false when another process holds it.
#[cfg(unix)]
fn try_lock(file: &fs::File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

#[cfg(not(unix))]
fn try_lock(_file: &fs::File) -> std::io::Result<bool> {
    Ok(true)
}

fn check_replaceable(target: &Path, policy: &ReplacePolicy<'_>) -> Result<(), StagingError> {
    let Ok(meta) = target.symlink_metadata() else {
        return Ok(());
    };
    if !policy.force {
        return Err(StagingError::Exists {
            path: target.to_path_buf(),
        });
    }
    let not_ours = |what: &str| StagingError::NotOurs {
        path: target.to_path_buf(),
        what: what.to_string(),
    };
    if meta.file_type().is_symlink() {
        return Err(not_ours("a symbolic link"));
    }
    if !meta.is_dir() {
        return Err(not_ours("a file"));
    }
    let empty = fs::read_dir(target).map_err(io(target))?.next().is_none();
    if !empty && !(policy.is_ours)(target) {
        return Err(not_ours("a directory without anemone's manifest"));
    }
    let target_real = target.canonicalize().map_err(io(target))?;
    for input in policy.inputs {
        if let Ok(real) = input.canonicalize() {
            if real.starts_with(&target_real) {
                return Err(StagingError::InputInside {
                    path: target.to_path_buf(),
                    input: input.to_path_buf(),
                });
            }
        }
    }
    Ok(())
}

/// Partial outputs in `dir` whose writer is no longer running: this version's
/// `.NAME.anemone-partial` directories whose lock nobody holds, and the `.NAME.tmp-PID` debris of
/// earlier versions (see `is_legacy_debris`).
pub fn stale_partials(dir: &Path) -> Result<Vec<PathBuf>, StagingError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let path = entry.map_err(io(dir))?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(stem) = name
            .strip_prefix('.')
            .and_then(|n| n.strip_suffix(PARTIAL_SUFFIX))
        {
            if !lock_is_held(&dir.join(format!(".{stem}{LOCK_SUFFIX}")))? {
                out.push(path);
            }
        } else if is_legacy_debris(&path, &name) {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Earlier versions staged outputs in `.NAME.tmp-PID` beside the target and left them behind
/// when killed. Such an entry is ours only if its process is gone **and** it holds what we
/// wrote there (a directory with a bundle or package manifest, or a `.npy` dump), so a stranger's
/// `.x.tmp-123` is never touched.
fn is_legacy_debris(path: &Path, name: &str) -> bool {
    let Some((stem, pid)) = name.strip_prefix('.').and_then(|n| n.rsplit_once(".tmp-")) else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    if stem.is_empty() || process_is_alive(pid) {
        return false;
    }
    let Ok(meta) = path.symlink_metadata() else {
        return false;
    };
    if meta.is_dir() {
        ["anemone.json", "Manifest.json"]
            .iter()
            .any(|manifest| path.join(manifest).is_file())
    } else {
        meta.is_file() && stem.ends_with(".npy")
    }
}

#[cfg(unix)]
fn process_is_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists; nothing is delivered.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Without a way to ask, every process is presumed alive and nothing legacy is removed.
#[cfg(not(unix))]
fn process_is_alive(_pid: u32) -> bool {
    true
}

/// Removes the partial outputs of dead writers in `dir`; returns what was removed.
pub fn remove_stale(dir: &Path) -> Result<Vec<PathBuf>, StagingError> {
    let mut removed = Vec::new();
    for path in stale_partials(dir)? {
        if !path.to_string_lossy().ends_with(PARTIAL_SUFFIX) {
            remove_entry(&path)?;
            removed.push(path);
            continue;
        }
        // Re-checked under the writer's lock, so a writer starting now is never disturbed.
        let lock = path.with_extension("anemone-lock");
        let Ok(mut lock) = WriterLock::acquire(&lock)? else {
            continue;
        };
        if path.symlink_metadata().is_ok() {
            fs::remove_dir_all(&path).map_err(io(&path))?;
            removed.push(path);
        }
        lock.release();
    }
    Ok(removed)
}

fn remove_entry(path: &Path) -> Result<(), StagingError> {
    let removed = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    removed.map_err(io(path))
}

/// Swaps two directory entries atomically where the OS can; otherwise moves `target` aside,
/// renames `partial` into place and leaves the previous output at `partial`.
fn exchange(partial: &Path, target: &Path) -> Result<(), StagingError> {
    match atomic_exchange(partial, target) {
        Ok(()) => Ok(()),
        Err(e) if exchange_unsupported(&e) => {
            let aside = partial.with_extension("previous");
            fs::rename(target, &aside).map_err(io(target))?;
            fs::rename(partial, target).map_err(io(target))?;
            fs::rename(&aside, partial).map_err(io(partial))
        }
        Err(e) => Err(io(target)(e)),
    }
}

#[cfg(target_os = "linux")]
fn atomic_exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (a, b) = (cstr(a)?, cstr(b)?);
    // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(target_vendor = "apple")]
fn atomic_exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (a, b) = (cstr(a)?, cstr(b)?);
    // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::renamex_np(a.as_ptr(), b.as_ptr(), libc::RENAME_SWAP) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(any(target_os = "linux", target_vendor = "apple")))]
fn atomic_exchange(_a: &Path, _b: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

fn exchange_unsupported(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(
            e.raw_os_error(),
            Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::ENOTSUP)
        ) || e.kind() == std::io::ErrorKind::Unsupported
    }
    #[cfg(not(unix))]
    {
        e.kind() == std::io::ErrorKind::Unsupported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(p: &Path) -> bool {
        p.join("anemone.json").is_file()
    }

    fn policy<'a>(force: bool, inputs: &'a [&'a Path]) -> ReplacePolicy<'a> {
        ReplacePolicy {
            force,
            is_ours: &ours,
            inputs,
        }
    }

    fn write_output(target: &Path, force: bool, marker: &str) -> Result<PathBuf, StagingError> {
        let p = policy(force, &[]);
        let staging = Staging::begin(target, &p)?;
        fs::write(staging.path().join("anemone.json"), marker).map_err(io(staging.path()))?;
        staging.commit(&p)
    }

    #[test]
    fn a_new_output_appears_whole_and_leaves_no_partial() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.bundle");
        write_output(&target, false, "one").unwrap();
        assert_eq!(
            fs::read_to_string(target.join("anemone.json")).unwrap(),
            "one"
        );
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "debris beside the output: {names:?}");
    }

    #[test]
    fn an_existing_output_needs_force_and_is_exchanged() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.bundle");
        write_output(&target, false, "one").unwrap();
        assert!(matches!(
            write_output(&target, false, "two"),
            Err(StagingError::Exists { .. })
        ));
        write_output(&target, true, "two").unwrap();
        assert_eq!(
            fs::read_to_string(target.join("anemone.json")).unwrap(),
            "two"
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn force_refuses_what_is_not_ours_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("models");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("model.gguf"), "weights").unwrap();
        let err = write_output(&target, true, "x").unwrap_err();
        assert!(
            err.to_string().contains("not an output of anemone"),
            "{err}"
        );
        assert!(target.join("model.gguf").is_file());
        let file = dir.path().join("notes.txt");
        fs::write(&file, "keep").unwrap();
        assert!(matches!(
            write_output(&file, true, "x"),
            Err(StagingError::NotOurs { .. })
        ));
        assert_eq!(fs::read_to_string(&file).unwrap(), "keep");
    }

    #[test]
    fn force_refuses_a_target_holding_an_input() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("anemone.json"), "old").unwrap();
        let input = target.join("model.gguf");
        fs::write(&input, "weights").unwrap();
        let inputs = [input.as_path()];
        let err = Staging::begin(&target, &policy(true, &inputs)).unwrap_err();
        assert!(matches!(err, StagingError::InputInside { .. }), "{err}");
        assert!(input.is_file());
    }

    #[test]
    fn a_second_writer_is_refused_while_the_first_lives() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.bundle");
        let p = policy(false, &[]);
        let first = Staging::begin(&target, &p).unwrap();
        let err = Staging::begin(&target, &p).unwrap_err();
        assert!(
            matches!(err, StagingError::Busy { pid, .. } if pid == std::process::id()),
            "{err}"
        );
        assert!(stale_partials(dir.path()).unwrap().is_empty());
        drop(first);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn partials_of_dead_writers_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.bundle");
        let partial = partial_path(&target).unwrap();
        fs::create_dir(&partial).unwrap();
        fs::write(partial.join("chunk.bin"), vec![0u8; 64]).unwrap();
        // the dead writer's lock file: nobody holds its lock
        fs::write(lock_path(&target).unwrap(), "4194305").unwrap();
        assert_eq!(stale_partials(dir.path()).unwrap(), vec![partial.clone()]);
        write_output(&target, false, "one").unwrap();
        assert!(!partial.exists());
        assert!(stale_partials(dir.path()).unwrap().is_empty());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn remove_stale_clears_a_directory_of_dead_partials() {
        let dir = tempfile::tempdir().unwrap();
        let partial = partial_path(&dir.path().join("a.bundle")).unwrap();
        fs::create_dir(&partial).unwrap();
        assert_eq!(remove_stale(dir.path()).unwrap(), vec![partial.clone()]);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A pid that no process has: above the kernel's pid limit on Linux and macOS.
    const DEAD_PID: u32 = 99_999_999;

    #[test]
    fn remove_stale_clears_legacy_debris_of_dead_writers_only() {
        let dir = tempfile::tempdir().unwrap();
        let dead_bundle = dir.path().join(format!(".m.bundle.tmp-{DEAD_PID}"));
        fs::create_dir(&dead_bundle).unwrap();
        fs::write(dead_bundle.join("anemone.json"), "{}").unwrap();
        let dead_npy = dir.path().join(format!(".logits.npy.tmp-{DEAD_PID}"));
        fs::write(&dead_npy, b"half").unwrap();
        // Kept: a live writer's, and a dead process's directory that is not ours.
        let live = dir
            .path()
            .join(format!(".m2.bundle.tmp-{}", std::process::id()));
        fs::create_dir(&live).unwrap();
        fs::write(live.join("anemone.json"), "{}").unwrap();
        let stranger = dir.path().join(format!(".cache.tmp-{DEAD_PID}"));
        fs::create_dir(&stranger).unwrap();
        fs::write(stranger.join("data"), "x").unwrap();

        let removed = remove_stale(dir.path()).unwrap();
        assert_eq!(removed, vec![dead_npy.clone(), dead_bundle.clone()]);
        assert!(!dead_bundle.exists() && !dead_npy.exists());
        assert!(live.exists() && stranger.exists());
    }
}
