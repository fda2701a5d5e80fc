//! `anemone bench`: load time, TTFT, prefill and decode throughput, per-token latency and peak
//! RSS of a model on this machine — or, with --url, a load test of an OpenAI-compatible server.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anemone_runtime::backend::Arithmetic;
use anemone_runtime::backend::BackendKind;
use anemone_runtime::engine::{Engine, TimedRun};
use anemone_serve::loadgen::{self, quantile, LoadConfig};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use sha2::Digest;

use super::bench_peer::{self, GgufType, LlamaCppPeer};

/// Benchmark a checkpoint or bundle locally, or a running server (--url).
///
/// Local: the model is loaded once (load time reported apart), then --warmup untimed and --runs
/// timed runs each prefill a synthetic prompt of --prompt-len tokens (or --prompt-ids) and
/// generate --gen greedy tokens. Reports TTFT (= prefill), prefill and decode tok/s, per-token
/// latency p50/p95 and peak RSS, as a table or --json (with machine, OS, commit, model hash and
/// every raw timing).
///
/// Server: --concurrency clients send --requests streaming chat completions of --prompt-len
/// words (or lines of --prompt-file) with max_tokens --gen; reports throughput, TTFT and
/// inter-token latency p50/p95 and errors. Works against any OpenAI-compatible server.
///
/// With --llama-cpp SOURCE.gguf, llama.cpp (through llama-cpp-python, run by --python) is
/// measured in the same run as a peer: round by round with anemone, on the same prompt,
/// teacher-forced along anemone's greedy tokens, on SOURCE made into the GGUF of equal precision
/// (F16 for an fp16 bundle, F32 for an fp32 bundle or a checkpoint; --llama-cpp-type otherwise),
/// written to a temporary directory and removed afterwards. Prints anemone / llama.cpp ratios.
///
/// Examples:
///   anemone bench models/smollm2-135m-instruct.Q4_1.gguf --prompt-len 128 --gen 32 --runs 3
///   anemone bench smollm2.bundle --backend executor --json > bench.json
///   anemone bench smollm2.bundle --llama-cpp models/smollm2-135m-instruct.Q4_1.gguf --threads 2
///   anemone bench --url http://127.0.0.1:8080 --model-name smollm2 --concurrency 8 --requests 32
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BenchArgs {
    /// A checkpoint (Hugging Face dir or .gguf) or a bundle directory (local mode).
    #[arg(required_unless_present = "url", conflicts_with = "url")]
    pub model: Option<PathBuf>,
    /// Prompt tokens (local) or words (server) per request.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// Local mode: the prompt as comma-separated token ids, instead of --prompt-len synthetic
    /// ones (a real prompt's ids, e.g. another engine's, to run the same prompt).
    #[arg(long, value_delimiter = ',', num_args = 1.., conflicts_with_all = ["url", "prompt_len"])]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate per run/request.
    #[arg(long, default_value_t = 32)]
    pub gen: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Threads per forward pass (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Bundles: backends to run side by side (repeat or comma-separate).
    #[arg(long, value_parser = super::backend_parser(), value_delimiter = ',')]
    pub backend: Vec<BackendKind>,
    #[command(flatten)]
    pub coreml: super::CoreMlArgs,
    /// Bundles only: skip checking the bundle's files against the manifest's sha256 (for a
    /// bundle checked already, e.g. by `anemone inspect`).
    #[arg(long)]
    pub no_verify: bool,
    /// Bundles: the executor's arithmetic (default: the bundle's precision).
    #[arg(long)]
    pub precision: Option<Arithmetic>,
    /// One JSON object on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Local mode: also measure llama.cpp on this GGUF (the model's source), as a peer.
    #[arg(long, value_name = "SOURCE.gguf")]
    pub llama_cpp: Option<PathBuf>,
    /// The GGUF llama.cpp runs, made from --llama-cpp (default: equal precision, F16 or F32).
    #[arg(long, value_enum, requires = "llama_cpp")]
    pub llama_cpp_type: Option<GgufType>,
    /// The Python with llama-cpp-python and gguf that runs the peer (default: $ANEMONE_PYTHON,
    /// else python3).
    #[arg(long, requires = "llama_cpp")]
    pub python: Option<PathBuf>,
    /// Server mode: base URL of an OpenAI-compatible server.
    #[arg(long)]
    pub url: Option<String>,
    /// Server mode: the model name to request.
    #[arg(long, requires = "url")]
    pub model_name: Option<String>,
    /// Server mode: clients sending at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Server mode: requests in all.
    #[arg(long, default_value_t = 16)]
    pub requests: usize,
    /// Server mode: prompts, one per line (instead of --prompt-len synthetic words).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Server mode: bearer key.
    #[arg(long, env = "ANEMONE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    match (&args.url, &args.model) {
        (Some(url), _) => run_url(&args, url.clone()),
        (None, Some(model)) => run_local(&args, model),
        (None, None) => bail!("give MODEL_OR_BUNDLE or --url"),
    }
}

fn run_local(args: &BenchArgs, path: &Path) -> Result<()> {
    let is_bundle = path.join(anemone_models::bundle::MANIFEST_FILE).is_file();
    let kinds = match (is_bundle, args.backend.is_empty()) {
        (false, false) => {
            bail!("--backend applies to bundles; a checkpoint runs the fp32 reference forward")
        }
        (false, true) | (true, true) => vec![BackendKind::for_bundles()],
        (true, false) => args.backend.clone(),
    };
    let precision = match (args.precision, is_bundle) {
        (Some(p), _) => p,
        (None, true) => anemone_models::bundle::read_manifest(path)?
            .conversion
            .precision
            .into(),
        (None, false) => Arithmetic::Fp32,
    };
    let hashes = model_hashes(path, is_bundle)?;
    let mut peer = match &args.llama_cpp {
        Some(src) => Some(start_peer(args, src, path, is_bundle, precision)?),
        None => None,
    };
    let mut peer_runs: Vec<TimedRun> = Vec::new();
    let mut results = Vec::new();
    for kind in kinds {
        let choice = args.coreml.choice(kind, precision, args.threads);
        let started = Instant::now();
        let engine = Engine::open(path, &choice, 0, !args.no_verify)
            .with_context(|| format!("loading {}", path.display()))?;
        let load_s = started.elapsed().as_secs_f64();
        let load_timings = engine.load_timings();
        let vocab = engine.vocab_size() as u32;
        let prompt = local_prompt(args, vocab)?;
        let bar = indicatif::ProgressBar::new((args.warmup + args.runs) as u64)
            .with_message(format!("{} runs", label(is_bundle, kind)));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let mut runs: Vec<TimedRun> = Vec::new();
        for i in 0..args.warmup + args.runs {
            let run = engine.timed_run(&prompt, args.gen.max(1))?;
            // the peer's round right after anemone's, along the same tokens
            if let Some(peer) = peer.as_mut() {
                let peer_run = peer.timed(&prompt, &run.fed)?;
                if i >= args.warmup {
                    peer_runs.push(peer_run);
                }
            }
            if i >= args.warmup {
                runs.push(run);
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        let mut result = summary(label(is_bundle, kind), load_s, &runs);
        // Load and compile apart: the executor interprets packages and compiles nothing (0);
        // Core ML compiles each package (`.mlpackage` → `.mlmodelc`; 0 when its compiled-model
        // cache has it), timed apart from loading the compiled models (`load.packages_s`).
        result["load"] = match load_timings {
            Some(t) => json!({"verify_hashes_s": t.verify_s, "host_weights_s": t.host_s,
                              "packages_s": t.packages_s}),
            None => json!({"checkpoint_s": load_s}),
        };
        result["compile_s"] = match load_timings {
            Some(t) => json!(t.compile_s),
            None => json!(0.0),
        };
        // Core ML's compiled-model cache over the packages: `{"hits", "misses"}`; null for an
        // engine without one (the executor, a checkpoint) or with it bypassed (`--no-cache`).
        result["compile_cache"] = json!(load_timings.and_then(|t| t.compile_cache));
        results.push(result);
    }
    let peak_rss = peak_rss_bytes();
    let peer_result = peer.map(|p| peer_summary(&p, &peer_runs, &mut results));
    if args.json {
        let mut report = provenance();
        report["model"] = json!(path);
        report["model_sha256"] = json!(hashes.model);
        report["bundle_sha256"] = json!(hashes.bundle);
        for (key, value) in [
            ("prompt_len", json!(local_prompt_len(args))),
            ("gen", json!(args.gen)),
            ("runs", json!(args.runs)),
            ("warmup", json!(args.warmup)),
            ("threads", json!(args.threads)),
            ("peak_rss_bytes", json!(peak_rss)),
            ("file_huge_mapped_bytes", json!(file_huge_mapped_bytes())),
            ("results", json!(results)),
            ("peer", json!(peer_result)),
        ] {
            report[key] = value;
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: prompt {} tokens, {} generated, {} runs (+{} warmup)",
            path.display(),
            local_prompt_len(args),
            args.gen,
            args.runs,
            args.warmup
        );
        println!(
            "{:<22} {:>8} {:>9} {:>12} {:>11} {:>10} {:>10}",
            "engine", "load s", "TTFT ms", "prefill t/s", "decode t/s", "tok p50 ms", "tok p95 ms"
        );
        results.iter().chain(&peer_result).for_each(print_row);
        if let Some(p) = &peer_result {
            for r in &results {
                let ratio = |k: &str| r["ratio_to_peer"][k].as_f64().unwrap_or(0.0);
                println!(
                    "{} / {}: prefill {:.2}×, decode {:.2}×",
                    r["engine"].as_str().unwrap_or(""),
                    p["engine"].as_str().unwrap_or(""),
                    ratio("prefill"),
                    ratio("decode")
                );
            }
        }
        println!("peak RSS: {:.1} MiB", peak_rss as f64 / (1 << 20) as f64);
    }
    Ok(())
}

/// The local prompt: --prompt-ids, else --prompt-len synthetic ids spread over the vocabulary.
fn local_prompt(args: &BenchArgs, vocab: u32) -> Result<Vec<u32>> {
    match &args.prompt_ids {
        Some(ids) => {
            if let Some(id) = ids.iter().find(|&&id| id >= vocab) {
                bail!("--prompt-ids: token {id} is outside the model's vocabulary of {vocab}");
            }
            Ok(ids.clone())
        }
        None => Ok((0..args.prompt_len.max(1) as u32)
            .map(|i| (i * 7919 + 13) % vocab)
            .collect()),
    }
}

fn local_prompt_len(args: &BenchArgs) -> usize {
    args.prompt_ids
        .as_ref()
        .map_or(args.prompt_len.max(1), |ids| ids.len())
}

/// Starts the llama.cpp peer on `src` at the precision of `model` (or --llama-cpp-type).
fn start_peer(
    args: &BenchArgs,
    src: &Path,
    model: &Path,
    is_bundle: bool,
    precision: Arithmetic,
) -> Result<LlamaCppPeer> {
    if !src.is_file() {
        bail!("--llama-cpp {}: no such GGUF file", src.display());
    }
    let ty = match args.llama_cpp_type {
        Some(ty) => ty,
        None if is_bundle
            && anemone_models::bundle::read_manifest(model)?
                .compression
                .is_some() =>
        {
            bail!(
                "{} is a compressed bundle: give the llama.cpp type of equal bits with \
                 --llama-cpp-type (q8_0 for int8, q4_0 for int4)",
                model.display()
            )
        }
        None => match precision {
            Arithmetic::Fp32 => GgufType::F32,
            Arithmetic::Fp16 | Arithmetic::Fp16Acc => GgufType::F16,
        },
    };
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let context = local_prompt_len(args) + args.gen.max(1);
    let python = bench_peer::python(args.python.as_ref());
    LlamaCppPeer::start(&python, src, ty, threads, context)
}

/// The peer's summary row; adds each anemone result's `ratio_to_peer` (anemone / peer tok/s).
fn peer_summary(
    peer: &LlamaCppPeer,
    runs: &[TimedRun],
    results: &mut [serde_json::Value],
) -> serde_json::Value {
    let load_s = peer.ready["load_s"].as_f64().unwrap_or(0.0);
    let mut row = summary(peer.label.clone(), load_s, runs);
    row["ready"] = peer.ready.clone();
    row["peak_rss_bytes"] = json!(peer.peak_rss_bytes);
    let tok_s = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(0.0);
    for r in results.iter_mut() {
        let ratio = |k: &str| match tok_s(&row, k) {
            peer if peer > 0.0 => tok_s(r, k) / peer,
            _ => 0.0,
        };
        r["ratio_to_peer"] = json!({
            "peer": peer.label,
            "prefill": ratio("prefill_tok_s"),
            "decode": ratio("decode_tok_s"),
        });
    }
    row
}

/// One engine's row of the table.
fn print_row(r: &serde_json::Value) {
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    println!(
        "{:<22} {:>8.2} {:>9.1} {:>12.1} {:>11.1} {:>10.2} {:>10.2}",
        r["engine"].as_str().unwrap_or(""),
        f("load_s"),
        f("ttft_s") * 1e3,
        f("prefill_tok_s"),
        f("decode_tok_s"),
        f("token_p50_s") * 1e3,
        f("token_p95_s") * 1e3
    );
}

fn label(is_bundle: bool, kind: BackendKind) -> String {
    if is_bundle {
        format!("bundle/{kind}")
    } else {
        "checkpoint/reference".to_string()
    }
}

fn summary(engine: String, load_s: f64, runs: &[TimedRun]) -> serde_json::Value {
    let prefill: Vec<f64> = runs.iter().map(|r| r.prefill_s).collect();
    let tokens: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.token_s.iter().copied())
        .collect();
    let prompt = runs.first().map_or(0, |r| r.prompt_tokens) as f64;
    let ttft = quantile(&prefill, 0.5);
    let decode_total: f64 = tokens.iter().sum();
    json!({
        "engine": engine, "load_s": load_s, "ttft_s": ttft,
        "prefill_tok_s": if ttft > 0.0 { prompt / ttft } else { 0.0 },
        "decode_tok_s": if decode_total > 0.0 { tokens.len() as f64 / decode_total } else { 0.0 },
        "token_p50_s": quantile(&tokens, 0.5), "token_p95_s": quantile(&tokens, 0.95),
        "raw": runs,
    })
}

fn run_url(args: &BenchArgs, url: String) -> Result<()> {
    let prompts: Vec<String> = match &args.prompt_file {
        Some(file) => std::fs::read_to_string(file)
            .with_context(|| format!("reading {}", file.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect(),
        None => (0..args.requests.max(1))
            .map(|i| {
                (0..args.prompt_len.max(1))
                    .map(|w| format!("w{}", (i * 31 + w * 7) % 97))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect(),
    };
    if prompts.is_empty() {
        bail!("no prompts");
    }
    let model = args
        .model_name
        .clone()
        .context("--model-name is needed with --url")?;
    let config = LoadConfig {
        url,
        model,
        api_key: args.api_key.clone(),
        concurrency: args.concurrency,
        requests: args.requests,
        prompts,
        max_tokens: args.gen,
    };
    let bar = indicatif::ProgressBar::new(args.requests as u64);
    let tick = bar.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(loadgen::run(config, move || tick.inc(1)));
    bar.finish_and_clear();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&{
                let mut out = provenance();
                out["report"] = json!(report);
                out
            })?
        );
    } else {
        println!(
            "{} model {}: {} requests, concurrency {}",
            report.url, report.model, report.requests, report.concurrency
        );
        println!(
            "completed {} errors {} in {:.2} s: {:.2} req/s, {:.1} output tok/s",
            report.completed,
            report.errors,
            report.duration_s,
            report.request_throughput,
            report.output_tok_s
        );
        println!("TTFT p50 {:.1} ms p95 {:.1} ms; inter-token p50 {:.1} ms p95 {:.1} ms; e2e p50 {:.2} s", report.ttft_p50_s * 1e3, report.ttft_p95_s * 1e3, report.itl_p50_s * 1e3, report.itl_p95_s * 1e3, report.e2e_p50_s);
        if let Some(e) = report.timings.iter().find_map(|t| t.error.as_deref()) {
            println!("first error: {e}");
        }
    }
    Ok(())
}

struct Hashes {
    /// The checkpoint's: its file, its directory's files in name order, or (for a bundle) the
    /// manifest's record of the files it was converted from.
    model: String,
    /// A bundle's: its manifest, which lists every file's sha256.
    bundle: Option<String>,
}

fn model_hashes(path: &Path, is_bundle: bool) -> Result<Hashes> {
    if !is_bundle {
        return Ok(Hashes {
            model: hash_model(path)?,
            bundle: None,
        });
    }
    let manifest = anemone_models::bundle::read_manifest(path)?;
    let mut hasher = sha2::Sha256::new();
    for source in &manifest.provenance {
        hasher.update(serde_json::to_string(source)?.as_bytes());
        hasher.update(b"\n");
    }
    Ok(Hashes {
        model: hex::encode(hasher.finalize()),
        bundle: Some(hash_model(path)?),
    })
}

/// sha256 of a file, of a bundle's manifest (which lists every file's sha256), or of a checkpoint
/// directory's files in name order.
fn hash_model(path: &Path) -> Result<String> {
    let mut hasher = sha2::Sha256::new();
    let mut files = Vec::new();
    if path.is_file() {
        files.push(path.to_path_buf());
    } else if path.join(anemone_models::bundle::MANIFEST_FILE).is_file() {
        files.push(path.join(anemone_models::bundle::MANIFEST_FILE));
    } else {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        entries.sort();
        files = entries;
    }
    for file in files {
        let mut f =
            std::fs::File::open(&file).with_context(|| format!("hashing {}", file.display()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

/// What every report carries: machine, OS, anemone's version and commit, and the load average
/// when it started (figures depend on it).
fn provenance() -> serde_json::Value {
    json!({
        "machine": machine(),
        "os": std::env::consts::OS,
        "os_version": os_version(),
        "kernel": read_trimmed("/proc/sys/kernel/osrelease"),
        "arch": std::env::consts::ARCH,
        "anemone_version": env!("CARGO_PKG_VERSION"),
        "commit": commit(),
        "load_average": read_trimmed("/proc/loadavg")
            .map(|l| l.split_whitespace().take(3).map(str::to_string).collect::<Vec<_>>()),
    })
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn os_version() -> Option<String> {
    if cfg!(target_os = "macos") {
        let out = std::process::Command::new("sw_vers")
            .arg("-productVersion")
            .output()
            .ok()?;
        return Some(format!(
            "macOS {}",
            String::from_utf8_lossy(&out.stdout).trim()
        ));
    }
    let release = std::fs::read_to_string("/etc/os-release").ok()?;
    release.lines().find_map(|l| {
        l.strip_prefix("PRETTY_NAME=")
            .map(|v| v.trim_matches('"').to_string())
    })
}

fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
    });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    json!({"cpu": cpu, "cores": cores, "memory_bytes": memory_bytes})
}

/// The commit of the checkout the running binary was built in (git run beside the executable,
/// not in the working directory), with `-dirty` when tracked files differ from it.
fn commit() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// Peak resident set size of this process, bytes (0 where unknown).
fn peak_rss_bytes() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: getrusage writes into the zeroed struct we own.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } == 0 {
            let max = usage.ru_maxrss as u64;
            return if cfg!(target_os = "macos") {
                max
            } else {
                max * 1024
            };
        }
    }
    0
}

/// Bytes of files (the weights) this process maps in huge pages at the end of the runs
/// (`FilePmdMapped` of `/proc/self/smaps_rollup`); `None` where the system cannot tell. A
/// decode streams every weight a token: in 4 KiB pages it misses the TLB on every page.
fn file_huge_mapped_bytes() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup.lines().find(|l| l.starts_with("FilePmdMapped:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
