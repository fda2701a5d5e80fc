//! A stable-Rust fuzz driver: mutates the seed corpus of a target with a seeded RNG (bit flips,
//! interesting integers, truncation, chunk duplication/removal, splices between seeds) and runs
//! the target on every input, catching panics. A panic's input is saved under
//! `fuzz/artifacts/TARGET/` and the driver exits 1; an input slower than 10 s is reported.
//!
//! Usage: cargo run --release --bin drive -- TARGET [SECONDS] [SEED]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    7,
    8,
    31,
    32,
    63,
    64,
    255,
    256,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    i64::MAX as u64,
    u64::MAX,
];

fn mutate(input: &mut Vec<u8>, seeds: &[Vec<u8>], rng: &mut Rng) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 if len >= 8 => {
                let width = [1usize, 2, 4, 8][rng.below(4)];
                let i = rng.below(len - width + 1);
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                input[i..i + width].copy_from_slice(&v[..width]);
            }
            3 if len > 0 => input.truncate(rng.below(len)),
            4 if len > 1 => {
                let a = rng.below(len);
                let n = 1 + rng.below((len - a).min(256));
                input.drain(a..a + n);
            }
            5 if len > 1 => {
                let a = rng.below(len);
                let n = 1 + rng.below((len - a).min(256));
                let chunk = input[a..a + n].to_vec();
                let at = rng.below(len);
                input.splice(at..at, chunk);
            }
            6 if !seeds.is_empty() => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() && len > 0 {
                    let a = rng.below(other.len());
                    let n = 1 + rng.below((other.len() - a).min(1024));
                    let at = rng.below(len);
                    let end = (at + n).min(len);
                    input.splice(at..end, other[a..a + n].iter().copied());
                }
            }
            _ if len > 0 => {
                // an ASCII digit or JSON token, for the text formats
                let tokens: &[&[u8]] = &[b"-1", b"1e308", b"null", b"\"\"", b"[]", b"{}", b"0"];
                let t = tokens[rng.below(tokens.len())];
                let at = rng.below(len);
                input.splice(at..at, t.iter().copied());
            }
            _ => input.push(rng.next() as u8),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(name) = args.get(1) else {
        eprintln!("usage: drive TARGET [SECONDS] [SEED]; targets: {}", names());
        std::process::exit(2);
    };
    let Some(&(_, target)) = anemone_fuzz::TARGETS.iter().find(|(n, _)| n == name) else {
        eprintln!("unknown target `{name}`; targets: {}", names());
        std::process::exit(2);
    };
    let seconds: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus_dir = root.join("corpus").join(name);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&corpus_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", corpus_dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!seeds.is_empty(), "{}: no seeds", corpus_dir.display());
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut runs, mut slowest) = (0u64, Duration::ZERO);
    // every seed as is first
    let mut queue: Vec<Vec<u8>> = seeds.clone();
    while Instant::now() < deadline {
        let input = queue.pop().unwrap_or_else(|| {
            let mut input = seeds[rng.below(seeds.len())].clone();
            mutate(&mut input, &seeds, &mut rng);
            input
        });
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(|| target(&input));
        let took = started.elapsed();
        slowest = slowest.max(took);
        runs += 1;
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let dir = root.join("artifacts").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("crash-seed{seed}-run{runs}"));
            std::fs::write(&path, &input).unwrap();
            eprintln!("{name}: PANIC after {runs} runs: {message}\n  input: {}", path.display());
            std::process::exit(1);
        }
        if took > Duration::from_secs(10) {
            eprintln!("{name}: an input took {took:?} (run {runs})");
        }
    }
    println!(
        "{name}: {runs} runs in {seconds} s, no panic (seed {seed}, {} seeds, slowest input {:.1} ms)",
        seeds.len(),
        slowest.as_secs_f64() * 1e3
    );
}

fn names() -> String {
    anemone_fuzz::TARGETS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}
