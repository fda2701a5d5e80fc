//! The child side of `anemone bisect`: the hidden `bisect-child` subcommand (load, prefill, decode
//! one variant bundle and print a JSON report) and the parent's spawn-and-wait, which turns a
//! signal, an error exit or a timeout into an [`Outcome`] instead of a crash of its own.
//!
//! Test hook: when `ANEMONE_BISECT_CRASH` holds `LABEL` or `LABEL:SIGNAL` (comma-separated; SIGNAL
//! one of abort, kill, segv, trap; default abort), the child running the variant `LABEL` kills
//! itself with that signal right after loading, as Core ML does on a package the Neural Engine
//! rejects.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anemone_backend::Backend;
use anemone_mil::Precision;
use anemone_runtime::backend::{run_on_backend, BackendKind, PipelineTask};
use anemone_runtime::pipeline::{CompileCache, Pipeline, PipelineOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

/// The environment variable of the crash test hook (see the module docs).
pub const CRASH_ENV: &str = "ANEMONE_BISECT_CRASH";

/// Internal: run one `anemone bisect` variant (spawned by bisect itself).
#[derive(Debug, Args)]
pub struct BisectChildArgs {
    /// The variant bundle.
    pub bundle: PathBuf,
    /// The variant's label (for the crash test hook and messages).
    #[arg(long)]
    pub label: String,
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: BackendKind,
    #[arg(long)]
    pub precision: Precision,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    #[arg(long, value_delimiter = ',')]
    pub forced_ids: Vec<u32>,
    /// Where the `[1 + forced, vocab]` f32 logits go.
    #[arg(long)]
    pub logits_out: PathBuf,
    #[command(flatten)]
    pub coreml: super::CoreMlArgs,
}

/// What a child measured, printed as one JSON line on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildReport {
    pub backend: String,
    /// Opening the bundle: hashing, host weights, loading (Core ML: compiling) every package.
    pub load_seconds: f64,
    /// Of `load_seconds`, compiling packages (Core ML: 0 for those its cache had).
    pub compile_seconds: f64,
    /// Core ML's compiled-model cache hits and misses over the packages; `None` for the
    /// executor (no cache) or with the cache bypassed.
    pub compile_cache: Option<CompileCache>,
    pub prefill_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_steps: usize,
    pub decode_seconds: f64,
    /// The child's peak resident set size (`getrusage`), where the OS reports it.
    pub peak_rss_bytes: Option<u64>,
}

impl ChildReport {
    pub fn ms_per_token(&self) -> Option<f64> {
        (self.decode_steps > 0).then(|| self.decode_seconds * 1e3 / self.decode_steps as f64)
    }
    pub fn prefill_tok_s(&self) -> Option<f64> {
        (self.prefill_seconds > 0.0).then(|| self.prefill_tokens as f64 / self.prefill_seconds)
    }
    pub fn decode_tok_s(&self) -> Option<f64> {
        (self.decode_seconds > 0.0).then(|| self.decode_steps as f64 / self.decode_seconds)
    }
}

/// The hidden subcommand.
pub fn run(args: BisectChildArgs) -> Result<()> {
    let choice = args
        .coreml
        .choice(args.backend, args.precision.into(), args.threads);
    let options = PipelineOptions {
        verify_hashes: false,
        host_threads: args.threads,
        ..PipelineOptions::default()
    };
    let task = ChildTask {
        args: &args,
        started: Instant::now(),
    };
    let report = run_on_backend(&args.bundle, &choice, &options, task)
        .with_context(|| format!("opening {}", args.bundle.display()))??;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

struct ChildTask<'a> {
    args: &'a BisectChildArgs,
    started: Instant,
}

impl PipelineTask for ChildTask<'_> {
    type Output = Result<ChildReport>;

    fn run<B: Backend>(self, pipeline: Pipeline<B>) -> Result<ChildReport> {
        let load_seconds = self.started.elapsed().as_secs_f64();
        crash_hook(&self.args.label);
        let mut session = pipeline.session()?;
        let vocab = pipeline.vocab_size();
        let mut logits = Vec::with_capacity(vocab * (1 + self.args.forced_ids.len()));
        let started = Instant::now();
        logits.extend(session.feed(&self.args.prompt_ids)?);
        let prefill_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        for &id in &self.args.forced_ids {
            logits.extend(session.feed(&[id])?);
        }
        let decode_seconds = started.elapsed().as_secs_f64();
        let rows = 1 + self.args.forced_ids.len();
        anemone_runtime::npy::write_f32(&self.args.logits_out, &[rows, vocab], &logits)?;
        Ok(ChildReport {
            backend: pipeline.backend().name(),
            load_seconds,
            compile_seconds: pipeline.load_timings().compile_s,
            compile_cache: pipeline.load_timings().compile_cache,
            prefill_tokens: self.args.prompt_ids.len(),
            prefill_seconds,
            decode_steps: self.args.forced_ids.len(),
            decode_seconds,
            peak_rss_bytes: peak_rss_bytes(),
        })
    }
}

/// Kills this process with the signal `ANEMONE_BISECT_CRASH` asks for, if it names `label`.
fn crash_hook(label: &str) {
    let Ok(spec) = std::env::var(CRASH_ENV) else {
        return;
    };
    let Some(signal) = spec.split(',').find_map(|entry| {
        let (target, signal) = entry.split_once(':').unwrap_or((entry, "abort"));
        (target.trim() == label).then(|| signal.trim().to_string())
    }) else {
        return;
    };
    let signal = signal.as_str();
    tracing::warn!(label, signal, "{CRASH_ENV}: killing this child");
    #[cfg(unix)]
    {
        // no core file for a deliberate crash
        let limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain libc calls on this process; the signals end it.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &limit);
            let signo = match signal {
                "kill" => libc::SIGKILL,
                "segv" => libc::SIGSEGV,
                "trap" => libc::SIGTRAP,
                _ => libc::SIGABRT,
            };
            libc::signal(signo, libc::SIG_DFL);
            libc::raise(signo);
        }
    }
    std::process::abort();
}

/// Peak resident set size of this process in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return None;
        }
        let max = usage.ru_maxrss.max(0) as u64;
        // Linux reports KiB, macOS bytes.
        if cfg!(target_vendor = "apple") {
            Some(max)
        } else {
            Some(max * 1024)
        }
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// What the parent asks a child to run.
pub struct ChildSpec<'a> {
    pub bundle: &'a Path,
    pub label: &'a str,
    pub backend: BackendKind,
    pub precision: Precision,
    pub threads: Option<usize>,
    pub prompt_ids: &'a [u32],
    pub forced_ids: &'a [u32],
    pub logits_out: &'a Path,
    pub timeout_seconds: u64,
    pub coreml: &'a super::CoreMlArgs,
}

/// How a child ended.
#[derive(Debug)]
pub enum Outcome {
    Finished(ChildReport),
    Signal {
        name: String,
        stderr_tail: Option<String>,
    },
    Failed {
        code: i32,
        stderr_tail: Option<String>,
    },
    Timeout,
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Runs the variant in a child process of this binary and waits for it (at most the timeout).
pub fn spawn(spec: &ChildSpec<'_>) -> Result<Outcome> {
    let exe = std::env::current_exe().context("finding this executable to re-run it")?;
    let mut command = Command::new(exe);
    command
        .arg("bisect-child")
        .arg(spec.bundle)
        .args(["--label", spec.label])
        .args(["--backend", spec.backend.name()])
        .args(["--precision", spec.precision.name()])
        .arg("--prompt-ids")
        .arg(csv(spec.prompt_ids))
        .arg("--logits-out")
        .arg(spec.logits_out)
        .args(["--compute-units", spec.coreml.compute_units.name()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !spec.forced_ids.is_empty() {
        command.arg("--forced-ids").arg(csv(spec.forced_ids));
    }
    if spec.coreml.no_cache {
        command.arg("--no-cache");
    }
    if let Some(threads) = spec.threads {
        command.args(["--threads", &threads.to_string()]);
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("starting the child of {}", spec.label))?;
    let mut pipes: HashMap<&str, std::thread::JoinHandle<String>> = HashMap::new();
    if let Some(mut out) = child.stdout.take() {
        pipes.insert(
            "stdout",
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            }),
        );
    }
    if let Some(mut err) = child.stderr.take() {
        pipes.insert(
            "stderr",
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                s
            }),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(spec.timeout_seconds);
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the child")? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            child
                .kill()
                .context("killing the child after its timeout")?;
            child.wait().context("reaping the killed child")?;
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut take = |name: &str| {
        pipes
            .remove(name)
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    };
    let stdout = take("stdout");
    let stderr = take("stderr");
    let Some(status) = status else {
        return Ok(Outcome::Timeout);
    };
    let stderr_tail = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string());
    if let Some(signo) = signal_of(&status) {
        return Ok(Outcome::Signal {
            name: signal_name(signo),
            stderr_tail,
        });
    }
    if !status.success() {
        return Ok(Outcome::Failed {
            code: status.code().unwrap_or(-1),
            stderr_tail,
        });
    }
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("the child of {} printed no report", spec.label))?;
    match serde_json::from_str(line) {
        Ok(report) => Ok(Outcome::Finished(report)),
        Err(e) => bail!("the child of {} printed a bad report: {e}", spec.label),
    }
}

#[cfg(unix)]
fn signal_of(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[cfg(not(unix))]
fn signal_of(_: &std::process::ExitStatus) -> Option<i32> {
    None
}

/// `SIGTRAP`, `SIGKILL`, … (or `signal N` for one not listed).
pub fn signal_name(signo: i32) -> String {
    #[cfg(unix)]
    {
        let known = [
            (libc::SIGTRAP, "SIGTRAP"),
            (libc::SIGKILL, "SIGKILL"),
            (libc::SIGABRT, "SIGABRT"),
            (libc::SIGSEGV, "SIGSEGV"),
            (libc::SIGBUS, "SIGBUS"),
            (libc::SIGILL, "SIGILL"),
            (libc::SIGFPE, "SIGFPE"),
            (libc::SIGTERM, "SIGTERM"),
            (libc::SIGINT, "SIGINT"),
            (libc::SIGPIPE, "SIGPIPE"),
        ];
        if let Some((_, name)) = known.iter().find(|(n, _)| *n == signo) {
            return (*name).to_string();
        }
    }
    format!("signal {signo}")
}
