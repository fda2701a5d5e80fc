//! A small team of helper threads for the parallel regions of the single-token (decode) path of
//! every engine on the CPU: the executor's matvecs and attention heads, the host's LM head, the
//! fp32 reference's decode step.
//!
//! A decode step runs a few hundred short parallel regions (one per group of projections)
//! separated by short serial stretches. Rayon parks its idle workers after a few dozen
//! `sched_yield`s, so most regions paid a futex wake and a reschedule. Helpers of a team spin
//! on one atomic for `SPIN` after their last region before they park, and a region hands out
//! work in blocks claimed from a shared counter, so a helper that is late (parked, or
//! preempted by another process) costs nothing: the calling thread takes its blocks. Which
//! thread computes a block never changes its values.
//!
//! One team per thread count is shared by the whole process ([`Team::shared`]), so the
//! executor, the host's LM head and the reference (a gate runs both) use the same threads (no
//! oversubscription).

use std::any::Any;
use std::cell::{RefCell, UnsafeCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks (yielding the core to any other runnable
/// thread after [`PURE_SPIN`]).
const SPIN: Duration = Duration::from_millis(2);
/// How long an idle helper spins without yielding: the gap between two regions of a decode
/// step is usually shorter.
const PURE_SPIN: Duration = Duration::from_micros(50);

/// `state`: bits 0..31 count the helpers inside the current region, bit 31 marks it closed,
/// bits 32.. number the regions.
const CLOSED: u64 = 1 << 31;
const COUNT: u64 = CLOSED - 1;

/// The most bytes of one [`Team::warm`] request the helpers ask for: about a core's L2, so the
/// first lines asked for are still there when the next region reads them.
const WARM_LIMIT: usize = 1 << 20;
/// Bytes a helper asks for between two looks for an opening region.
const WARM_PIECE: usize = 4096;

type Job = dyn Fn() + Sync;

struct Inner {
    state: AtomicU64,
    /// The current region's work; written only by the leader while no helper can join.
    job: UnsafeCell<Option<&'static Job>>,
    /// The panic of a helper's part of a region; the leader resumes it.
    panicked: Mutex<Option<Box<dyn Any + Send>>>,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    shutdown: AtomicBool,
    warm: Warm,
}

/// The bytes the next region will read, for idle helpers to ask the memory for ahead of it
/// ([`Team::warm`]). `seq` is odd while the leader rewrites `start` and `len`.
#[derive(Default)]
struct Warm {
    seq: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
}

impl Warm {
    /// The request numbered `seq`, if it is still the current one and was read whole.
    fn read(&self, seq: u64) -> Option<(usize, usize)> {
        let (start, len) = (
            self.start.load(Ordering::Acquire),
            self.len.load(Ordering::Acquire),
        );
        (seq.is_multiple_of(2) && self.seq.load(Ordering::Acquire) == seq).then_some((start, len))
    }
}

// SAFETY: `job` is written only by the leader while the region is closed with no helper inside
// (see `Team::run`), and read by helpers only after joining an open region, which the leader's
// release store of the open state happens-before.
unsafe impl Sync for Inner {}

/// A fixed set of `threads - 1` helper threads; the thread that starts a region is the other.
pub struct Team {
    inner: Arc<Inner>,
    threads: usize,
    /// Held by the thread running a region; others (or a nested region) run alone.
    busy: AtomicBool,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("threads", &self.threads)
            .finish()
    }
}

impl Team {
    /// A team of `threads` threads (the caller of a region counts as one).
    pub fn new(threads: usize) -> Result<Team, std::io::Error> {
        let threads = threads.max(1);
        let inner = Arc::new(Inner {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(None),
            panicked: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
            warm: Warm::default(),
        });
        for i in 1..threads {
            let inner = inner.clone();
            let place = Place {
                index: i - 1,
                helpers: threads - 1,
            };
            std::thread::Builder::new()
                .name(format!("anemone-team-{i}"))
                .spawn(move || helper(&inner, place))?;
        }
        Ok(Team {
            inner,
            threads,
            busy: AtomicBool::new(false),
        })
    }

    /// The process's team of `threads` threads, made on first use and kept while anyone holds
    /// it.
    pub fn shared(threads: usize) -> Result<Arc<Team>, std::io::Error> {
        static TEAMS: Mutex<Vec<(usize, Weak<Team>)>> = Mutex::new(Vec::new());
        let threads = threads.max(1);
        let mut teams = TEAMS.lock().unwrap_or_else(|e| e.into_inner());
        teams.retain(|(_, w)| w.strong_count() > 0);
        if let Some(team) = teams
            .iter()
            .find(|(n, _)| *n == threads)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(team);
        }
        let team = Arc::new(Team::new(threads)?);
        teams.push((threads, Arc::downgrade(&team)));
        Ok(team)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Asks the idle helpers to bring the first bytes of `start..start + len` (at most
    /// `WARM_LIMIT`, 1 MiB) toward their caches until the next region opens: the bytes the next
    /// region will stream (a decode step's next projection weights), asked for while the
    /// caller runs the serial ops between two regions and the memory would be idle. Software
    /// prefetch only: the bytes are never dereferenced (they need not stay mapped), and no
    /// value changes. Asking again for the current range does nothing.
    pub fn warm(&self, start: *const u8, len: usize) {
        let warm = &self.inner.warm;
        if self.threads == 1
            || (warm.start.load(Ordering::Relaxed) == start as usize
                && warm.len.load(Ordering::Relaxed) == len)
        {
            return;
        }
        warm.seq.fetch_add(1, Ordering::AcqRel);
        warm.start.store(start as usize, Ordering::Release);
        warm.len.store(len, Ordering::Release);
        warm.seq.fetch_add(1, Ordering::AcqRel);
    }

    /// Runs `work` on the calling thread and on every helper that joins in time; returns when
    /// all have returned. `work` must split its work itself (e.g. claim blocks from an atomic
    /// counter) so that any number of callers complete it. Runs `work` on the caller alone
    /// when the team is already running a region (another thread's, or this one's: nested).
    pub fn run(&self, work: &(dyn Fn() + Sync)) {
        if self.threads == 1
            || self
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            work();
            return;
        }
        let inner = &*self.inner;
        // SAFETY: the region is closed and empty (the previous `run` waited for its helpers),
        // so no helper reads `job` now; the lifetime is erased only until `Region::drop` has
        // waited for every helper that joined, before `run` returns or unwinds.
        unsafe {
            *inner.job.get() = Some(std::mem::transmute::<&(dyn Fn() + Sync), &'static Job>(
                work,
            ));
        }
        let epoch = (inner.state.load(Ordering::Relaxed) >> 32) + 1;
        inner.state.store(epoch << 32, Ordering::SeqCst);
        if inner.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = inner.lock.lock().unwrap_or_else(|e| e.into_inner());
            inner.wake.notify_all();
        }
        let region = Region { team: self };
        work();
        drop(region);
        let panicked = inner
            .panicked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
    }
}

/// Closes the current region and waits for the helpers inside it (also when the leader's own
/// part unwinds), then frees the team.
struct Region<'a> {
    team: &'a Team,
}

impl Drop for Region<'_> {
    fn drop(&mut self) {
        let inner = &*self.team.inner;
        inner.state.fetch_or(CLOSED, Ordering::AcqRel);
        let mut spins = 0u32;
        while inner.state.load(Ordering::Acquire) & COUNT != 0 {
            spins = spins.wrapping_add(1);
            // a block takes microseconds: spin that long, then let others have the core
            if spins > 1024 && spins.is_multiple_of(32) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        // SAFETY: closed and empty: no helper reads `job` until the next region opens.
        unsafe { *inner.job.get() = None };
        self.team.busy.store(false, Ordering::Release);
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        let _guard = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.wake.notify_all();
    }
}

/// A helper's index among the team's `helpers`: which pieces of a warm request it asks for.
#[derive(Clone, Copy)]
struct Place {
    index: usize,
    helpers: usize,
}

/// Asks for this helper's pieces of warm request `seq` until it is done, replaced, or a region
/// opens after region `seen`.
fn warm(inner: &Inner, place: Place, seq: u64, seen: u64) {
    let Some((start, len)) = inner.warm.read(seq) else {
        return;
    };
    let interrupted = || {
        inner.state.load(Ordering::Relaxed) >> 32 != seen
            || inner.warm.seq.load(Ordering::Relaxed) != seq
    };
    let pieces = len.min(WARM_LIMIT).div_ceil(WARM_PIECE);
    for piece in (place.index..pieces).step_by(place.helpers) {
        if interrupted() {
            return;
        }
        prefetch_piece(start.wrapping_add(piece * WARM_PIECE));
    }
}

/// Asks for the cache lines of the [`WARM_PIECE`] bytes at `at` (into L2).
fn prefetch_piece(at: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..WARM_PIECE).step_by(64) {
        // SAFETY: a prefetch is a hint: it never dereferences its address and never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                at.wrapping_add(line) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

fn helper(inner: &Inner, place: Place) {
    let mut seen = inner.state.load(Ordering::Acquire) >> 32;
    let mut idle_since = Instant::now();
    let mut spins = 0u32;
    let mut warmed = inner.warm.seq.load(Ordering::Acquire);
    loop {
        if inner.shutdown.load(Ordering::Relaxed) {
            return;
        }
        let s = inner.state.load(Ordering::Acquire);
        let epoch = s >> 32;
        if epoch != seen {
            if s & CLOSED != 0 {
                seen = epoch;
                continue;
            }
            if inner
                .state
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            seen = epoch;
            // SAFETY: joined an open region: `job` holds its work until this helper leaves.
            if let Some(job) = unsafe { *inner.job.get() } {
                if let Err(payload) = catch_unwind(AssertUnwindSafe(job)) {
                    *inner.panicked.lock().unwrap_or_else(|e| e.into_inner()) = Some(payload);
                }
            }
            inner.state.fetch_sub(1, Ordering::Release);
            idle_since = Instant::now();
            spins = 0;
            continue;
        }
        let warm_seq = inner.warm.seq.load(Ordering::Acquire);
        if warm_seq != warmed && warm_seq.is_multiple_of(2) {
            warmed = warm_seq;
            warm(inner, place, warm_seq, seen);
            idle_since = Instant::now();
            continue;
        }
        spins = spins.wrapping_add(1);
        if !spins.is_multiple_of(32) {
            std::hint::spin_loop();
            continue;
        }
        let idle = idle_since.elapsed();
        if idle < PURE_SPIN {
            continue;
        }
        if idle < SPIN {
            // lets a thread waiting for this core run (e.g. the leader, under load)
            std::thread::yield_now();
            continue;
        }
        let mut guard = inner.lock.lock().unwrap_or_else(|e| e.into_inner());
        inner.sleepers.fetch_add(1, Ordering::SeqCst);
        while inner.state.load(Ordering::SeqCst) >> 32 == seen
            && !inner.shutdown.load(Ordering::SeqCst)
        {
            guard = inner.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        inner.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
        idle_since = Instant::now();
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Team>>> = const { RefCell::new(None) };
}

/// Runs `f` with `team` as this thread's team for parallel regions ([`current`]).
pub fn with_team<R>(team: &Arc<Team>, f: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| c.replace(Some(team.clone())));
    struct Restore(Option<Arc<Team>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = previous);
        }
    }
    let _restore = Restore(previous);
    f()
}

/// This thread's team ([`with_team`]), else the process's default team, as wide as the global
/// rayon pool and kept for the life of the process; `None` only if no helper thread could be
/// started.
pub fn current() -> Option<Arc<Team>> {
    if let Some(team) = CURRENT.with(|c| c.borrow().clone()) {
        return Some(team);
    }
    static DEFAULT: std::sync::OnceLock<Option<Arc<Team>>> = std::sync::OnceLock::new();
    DEFAULT
        .get_or_init(|| Team::shared(rayon::current_num_threads()).ok())
        .clone()
}

/// Claims blocks `0..blocks` for the threads of a region: each call of `next` returns a block
/// no other call returned.
pub struct Blocks {
    next: AtomicUsize,
    blocks: usize,
}

impl Blocks {
    pub fn new(blocks: usize) -> Self {
        Blocks {
            next: AtomicUsize::new(0),
            blocks,
        }
    }

    pub fn next(&self) -> Option<usize> {
        let b = self.next.fetch_add(1, Ordering::Relaxed);
        (b < self.blocks).then_some(b)
    }
}

/// Claims runs of units `0..units` from both ends: [`Self::front`] hands out the lowest
/// unclaimed units, [`Self::back`] the highest; every unit is handed out once.
pub struct EndClaims {
    /// The next front unit (bits 0..32) and one past the next back unit (bits 32..).
    ends: AtomicU64,
}

impl EndClaims {
    pub fn new(units: usize) -> Self {
        let units = u32::try_from(units).expect("at most 2^32 - 1 units");
        EndClaims {
            ends: AtomicU64::new(u64::from(units) << 32),
        }
    }

    /// The lowest `len(unclaimed)` unclaimed units (at least one, at most all).
    pub fn front(&self, len: impl Fn(usize) -> usize) -> Option<std::ops::Range<usize>> {
        self.claim(|front, back| {
            let n = len(back - front).clamp(1, back - front);
            (front + n, back, front..front + n)
        })
    }

    /// The highest `len(unclaimed)` unclaimed units (at least one, at most all).
    pub fn back(&self, len: impl Fn(usize) -> usize) -> Option<std::ops::Range<usize>> {
        self.claim(|front, back| {
            let n = len(back - front).clamp(1, back - front);
            (front, back - n, back - n..back)
        })
    }

    /// Moves the ends by `step(front, back) = (front, back, claimed)` unless they have met.
    fn claim(
        &self,
        step: impl Fn(usize, usize) -> (usize, usize, std::ops::Range<usize>),
    ) -> Option<std::ops::Range<usize>> {
        let mut ends = self.ends.load(Ordering::Relaxed);
        loop {
            let (front, back) = ((ends & 0xFFFF_FFFF) as usize, (ends >> 32) as usize);
            if front >= back {
                return None;
            }
            let (front, back, claimed) = step(front, back);
            let next = (back as u64) << 32 | front as u64;
            match self
                .ends
                .compare_exchange_weak(ends, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(claimed),
                Err(now) => ends = now,
            }
        }
    }
}

/// Bytes of weight rows in a unit of [`for_each_run_from_ends`] for a decode matvec: small enough
/// that the two ends meet within a few microseconds of each other; the runs themselves are long.
pub const MATVEC_UNIT_BYTES: usize = 16 << 10;

/// Rows of `row_bytes` bytes in a matvec unit ([`MATVEC_UNIT_BYTES`]): a multiple of 4 (the
/// four-row passes of the matvec kernels), at least 4.
pub fn matvec_unit_rows(row_bytes: usize) -> usize {
    (MATVEC_UNIT_BYTES / row_bytes.max(1)).max(4) / 4 * 4
}

/// Runs `f(run)` over runs of units covering `0..units` once, spread over `team`: the helpers
/// claim runs from the front (the bytes [`Team::warm`] asked their caches for), the calling
/// thread from the back. Each claim takes `1 / (2 · threads)` of what is left (at least
/// `least` units): a few long runs of adjacent units (a core's prefetcher stays on one
/// stream) that shrink where the two ends meet, so no thread waits long for another's last
/// run (with equal blocks the caller waited up to a block for a late helper). Without a team
/// to share with, `f` runs once over all units.
pub fn for_each_run_from_ends(
    team: Option<&Team>,
    units: usize,
    least: usize,
    f: &(dyn Fn(std::ops::Range<usize>) + Sync),
) {
    let claims = EndClaims::new(units);
    let threads = team.map_or(1, |t| t.threads());
    let len = |left: usize| (left / (2 * threads)).max(least);
    let leader = std::thread::current().id();
    let work = || {
        let from_back = std::thread::current().id() == leader;
        while let Some(run) = if from_back {
            claims.back(len)
        } else {
            claims.front(len)
        } {
            f(run);
        }
    };
    match team {
        Some(team) if team.threads() > 1 && units > least => team.run(&work),
        _ if units > 0 => f(0..units),
        _ => {}
    }
}

/// Runs `f(block)` once for every block in `0..blocks`, spread over `team` (or this thread
/// alone when `team` is `None`).
pub fn for_each_block(team: Option<&Team>, blocks: usize, f: &(dyn Fn(usize) + Sync)) {
    let claims = Blocks::new(blocks);
    let work = || {
        while let Some(b) = claims.next() {
            f(b);
        }
    };
    match team {
        Some(team) if blocks > 1 => team.run(&work),
        _ => work(),
    }
}

/// [`for_each_block`] with a scratch value per thread: every thread that runs blocks of the
/// region makes one with `init` and hands it to each of its `f(scratch, block)` calls; the
/// scratch is dropped when the region ends (nothing stays resident on the team's threads).
pub fn for_each_block_with<S>(
    team: Option<&Team>,
    blocks: usize,
    init: &(dyn Fn() -> S + Sync),
    f: &(dyn Fn(&mut S, usize) + Sync),
) {
    let claims = Blocks::new(blocks);
    let work = || {
        let mut scratch = None;
        while let Some(b) = claims.next() {
            f(scratch.get_or_insert_with(init), b);
        }
    };
    match team {
        Some(team) if blocks > 1 => team.run(&work),
        _ => work(),
    }
}

/// A raw view of a mutable f32 buffer that the blocks of a region write disjoint parts of.
#[derive(Clone, Copy)]
pub struct SharedOut {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: used only to hand disjoint ranges of one `&mut [f32]` to the threads of a region,
// which ends before the borrow it was made from.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub fn new(dst: &mut [f32]) -> Self {
        SharedOut {
            ptr: dst.as_mut_ptr(),
            len: dst.len(),
        }
    }

    /// # Safety
    /// `range` lies inside the buffer, no other live slice covers it, and the buffer outlives
    /// the returned slice.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, range: std::ops::Range<usize>) -> &mut [f32] {
        debug_assert!(range.start <= range.end && range.end <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_runs_once_whoever_runs_it() {
        for threads in [1, 2, 3] {
            let team = Team::new(threads).unwrap();
            for blocks in [0usize, 1, 2, 7, 100] {
                for _ in 0..50 {
                    let hits: Vec<AtomicUsize> = (0..blocks).map(|_| AtomicUsize::new(0)).collect();
                    for_each_block(Some(&team), blocks, &|b| {
                        hits[b].fetch_add(1, Ordering::Relaxed);
                    });
                    assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
                }
            }
        }
    }

    #[test]
    fn runs_claimed_from_both_ends_cover_every_unit_once() {
        for units in [0usize, 1, 2, 3, 64, 1000] {
            for least in [1, 3, 8] {
                let claims = EndClaims::new(units);
                let mut seen = vec![0u32; units];
                let mut turn = 0usize;
                // an uneven interleaving of the two ends, shrinking runs
                loop {
                    turn += 1;
                    let len = |left: usize| (left / 4).max(least);
                    let claimed = if turn.is_multiple_of(3) {
                        claims.back(len)
                    } else {
                        claims.front(len)
                    };
                    match claimed {
                        Some(run) => run.for_each(|u| seen[u] += 1),
                        None => break,
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "{units} units: {seen:?}");
                assert_eq!((claims.front(|_| 1), claims.back(|_| 1)), (None, None));
            }
        }
        for threads in [1, 2, 3] {
            let team = Team::new(threads).unwrap();
            for _ in 0..50 {
                let hits: Vec<AtomicUsize> = (0..137).map(|_| AtomicUsize::new(0)).collect();
                for_each_run_from_ends(Some(&team), hits.len(), 4, &|run| {
                    run.for_each(|u| {
                        hits[u].fetch_add(1, Ordering::Relaxed);
                    })
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn warm_requests_for_any_bytes_leave_regions_whole() {
        // freed memory, the top of the address space, nothing: a request is a hint only
        let freed = vec![0u8; 2 * WARM_LIMIT];
        let freed_at = freed.as_ptr();
        drop(freed);
        let requests = [
            (freed_at, 2 * WARM_LIMIT),
            ((usize::MAX - 100) as *const u8, usize::MAX),
            (std::ptr::null(), 0),
        ];
        for threads in [1, 2, 3] {
            let team = Team::new(threads).unwrap();
            for (start, len) in requests {
                team.warm(start, len);
                // a helper is inside the request, or done with it, when the region opens
                std::thread::sleep(Duration::from_micros(100));
                let hits: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
                for_each_block(Some(&team), hits.len(), &|b| {
                    hits[b].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn per_thread_scratch_is_made_once_per_thread_that_runs_blocks() {
        let team = Team::new(2).unwrap();
        let (made, hits) = (AtomicUsize::new(0), AtomicUsize::new(0));
        for_each_block_with(
            Some(&team),
            40,
            &|| {
                made.fetch_add(1, Ordering::Relaxed);
                0usize
            },
            &|count: &mut usize, _| {
                *count += 1;
                hits.fetch_add(1, Ordering::Relaxed);
            },
        );
        assert_eq!(hits.load(Ordering::Relaxed), 40);
        assert!((1..=2).contains(&made.load(Ordering::Relaxed)));
    }

    #[test]
    fn a_nested_region_runs_on_its_caller() {
        let team = Team::new(2).unwrap();
        let total = AtomicUsize::new(0);
        for_each_block(Some(&team), 4, &|_| {
            for_each_block(Some(&team), 3, &|_| {
                total.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 12);
    }

    #[test]
    fn a_helper_panic_reaches_the_leader_and_the_team_still_works() {
        let team = Team::new(2).unwrap();
        let caught = catch_unwind(AssertUnwindSafe(|| {
            for_each_block(Some(&team), 64, &|b| {
                if b == 63 {
                    panic!("block {b}");
                }
                std::thread::sleep(Duration::from_micros(50));
            })
        }));
        assert!(caught.is_err());
        let total = AtomicUsize::new(0);
        for_each_block(Some(&team), 10, &|_| {
            total.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 10);
    }

    #[test]
    fn shared_teams_are_one_per_width() {
        let a = Team::shared(3).unwrap();
        let b = Team::shared(3).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(Team::shared(1).unwrap().threads(), 1);
    }
}
