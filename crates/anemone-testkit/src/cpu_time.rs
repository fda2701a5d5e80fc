//! CPU time for benchmarks that run on a shared machine: a busy neighbour's preemptions inflate
//! wall time, not the CPU time a thread or the process spent.

/// CPU seconds of the calling thread (Linux; wall seconds since the first call elsewhere).
pub fn thread_seconds() -> f64 {
    clock_seconds(Clock::Thread)
}

/// CPU seconds of the whole process, all threads (Linux; wall seconds since the first call
/// elsewhere).
pub fn process_seconds() -> f64 {
    clock_seconds(Clock::Process)
}

#[derive(Clone, Copy)]
enum Clock {
    Process,
    Thread,
}

#[cfg(target_os = "linux")]
fn clock_seconds(clock: Clock) -> f64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    // <time.h> on Linux
    const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let id = match clock {
        Clock::Process => CLOCK_PROCESS_CPUTIME_ID,
        Clock::Thread => CLOCK_THREAD_CPUTIME_ID,
    };
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill; both ids exist on every Linux.
    let rc = unsafe { clock_gettime(id, &mut t) };
    assert_eq!(rc, 0, "clock_gettime({id}) failed");
    t.sec as f64 + t.nsec as f64 * 1e-9
}

#[cfg(not(target_os = "linux"))]
fn clock_seconds(_clock: Clock) -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Spinning for a while advances both clocks by about as much as wall time; sleeping does
    /// not advance the thread's.
    #[test]
    fn cpu_clocks_count_work_not_sleep() {
        let (thread0, process0, wall0) = (thread_seconds(), process_seconds(), Instant::now());
        let mut x = 0u64;
        while wall0.elapsed().as_millis() < 50 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let spun = thread_seconds() - thread0;
        assert!(
            spun > 0.005,
            "thread clock advanced {spun} s over 50 ms of work"
        );
        assert!(process_seconds() - process0 >= spun * 0.5);
        let slept0 = thread_seconds();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = thread_seconds() - slept0;
        assert!(
            slept < 0.025,
            "thread clock advanced {slept} s while sleeping 50 ms"
        );
    }
}
