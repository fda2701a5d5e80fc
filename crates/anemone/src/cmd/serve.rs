//! `anemone serve`: the OpenAI-compatible HTTP server over one or more models.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anemone_mil::Precision;
use anemone_models::families::ModelKind;
use anemone_runtime::backend::BackendKind;
use anemone_runtime::encoder::Encoder;
use anemone_runtime::engine::Engine;
use anemone_serve::{serve, Models, ServeConfig};
use anyhow::{bail, Context, Result};
use clap::Args;

/// Serve models over an OpenAI-compatible HTTP API: POST /v1/chat/completions (stream: true as
/// server-sent events; logprobs/top_logprobs), POST /v1/completions, POST /v1/embeddings
/// (encoder models), GET /v1/models, GET /health, GET /metrics (Prometheus text). Each request runs on its own session; --max-sessions run at once, up to
/// --queue more wait, beyond them the answer is 429 with Retry-After. A request whose tokens
/// extend a kept session's (the next turn of a chat) continues from its KV state. SIGTERM or
/// ctrl-c: stop accepting, finish in-flight work (cancelled after --shutdown-grace), exit 0.
///
/// Examples:
///   anemone serve --model smollm2=models/smollm2-135m-instruct.Q4_1.gguf --port 8080
///   anemone serve --model s=smollm2.bundle --max-sessions 4 --queue 16 --api-key secret
///   anemone serve --model minilm=models/all-minilm-l6-v2 --model chat=smollm2.bundle
///   curl -s localhost:8080/v1/chat/completions -H 'content-type: application/json' \
///     -d '{"model":"smollm2","messages":[{"role":"user","content":"Hi"}],"max_tokens":16}'
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ServeArgs {
    /// NAME=PATH: a checkpoint (Hugging Face dir or .gguf, fp32 reference forward) or a bundle
    /// directory (run on --backend), served as model NAME. Repeat for several models. Decoders
    /// serve the completion endpoints, encoders /v1/embeddings.
    #[arg(long = "model", value_name = "NAME=PATH", required = true)]
    pub models: Vec<String>,

    /// Address to listen on (loopback by default; anything else exposes the server).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Port (0 picks a free one; the address is printed on stdout).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,

    /// Bundles only: the engine that runs the packages.
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<BackendKind>,
    #[command(flatten)]
    pub coreml: super::CoreMlArgs,
    /// Bundles only: skip checking the bundle's files against the manifest's sha256 (for a
    /// bundle checked already, e.g. by `anemone inspect`).
    #[arg(long)]
    pub no_verify: bool,

    /// Bundles only: the executor's arithmetic (default: the bundle's precision; fp16 for
    /// encoder bundles).
    #[arg(long)]
    pub precision: Option<anemone_runtime::backend::Arithmetic>,

    /// Threads per forward pass (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Requests generating at once (each on its own KV state).
    #[arg(long, default_value_t = 4)]
    pub max_sessions: usize,

    /// Requests waiting for a session; beyond them the answer is 429.
    #[arg(long, default_value_t = 64)]
    pub queue: usize,

    /// MiB of KV state kept after requests for prefix reuse, per model (0: off).
    #[arg(long, default_value_t = 512)]
    pub kv_memory: usize,

    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long, env = "ANEMONE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Largest request body in KiB (413 above).
    #[arg(long, default_value_t = 1024)]
    pub body_limit_kib: usize,

    /// Seconds in-flight generations may run after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace: u64,
}

pub fn run(args: ServeArgs) -> Result<()> {
    if args.max_sessions == 0 {
        bail!("--max-sessions must be at least 1");
    }
    let mut models = BTreeMap::new();
    let mut encoders = BTreeMap::new();
    for spec in &args.models {
        let (name, path) = spec
            .split_once('=')
            .with_context(|| format!("--model `{spec}`: expected NAME=PATH"))?;
        if name.is_empty() || models.contains_key(name) || encoders.contains_key(name) {
            bail!("--model `{spec}`: the name is empty or given twice");
        }
        let path = PathBuf::from(path);
        let kind = args.backend.unwrap_or_else(BackendKind::for_bundles);
        if model_kind(&path).with_context(|| format!("--model `{spec}`"))? == ModelKind::Encoder {
            let precision = args.precision.unwrap_or(Precision::Fp16.into());
            let choice = args.coreml.choice(kind, precision, args.threads);
            let started = std::time::Instant::now();
            let encoder = Encoder::open_on(&path, &choice)
                .with_context(|| format!("loading encoder `{name}`"))?;
            tracing::info!(
                model = name,
                engine = encoder.description,
                load_s = started.elapsed().as_secs_f64(),
                "encoder loaded"
            );
            encoders.insert(name.to_string(), Arc::new(encoder));
            continue;
        }
        let precision = match args.precision {
            Some(p) => p,
            None => bundle_precision(&path)?.into(),
        };
        let choice = args.coreml.choice(kind, precision, args.threads);
        let started = std::time::Instant::now();
        let engine = Engine::open(&path, &choice, args.kv_memory << 20, !args.no_verify)
            .with_context(|| format!("loading model `{name}`"))?;
        tracing::info!(
            model = name,
            kind = engine.kind(),
            context = engine.context_len(),
            load_s = started.elapsed().as_secs_f64(),
            "model loaded"
        );
        models.insert(name.to_string(), Arc::new(engine));
    }
    let config = ServeConfig {
        addr: SocketAddr::new(args.host, args.port),
        max_sessions: args.max_sessions,
        queue: args.queue,
        api_key: args.api_key.clone(),
        body_limit: args.body_limit_kib << 10,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(args.max_sessions + 4)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(serve(
            config,
            Models {
                decoders: models,
                encoders,
            },
            |addr| {
                println!("anemone serve: listening on http://{addr}");
            },
        ))
        .context("serving")?;
    eprintln!("anemone serve: stopped");
    Ok(())
}

/// Whether `path` (a bundle, a Hugging Face directory or a GGUF file) holds an encoder.
fn model_kind(path: &std::path::Path) -> Result<ModelKind> {
    if path.join(anemone_models::bundle::MANIFEST_FILE).is_file() {
        Ok(anemone_models::encoder::bundle::bundle_kind(path)?)
    } else if path.exists() {
        Ok(anemone_models::families::model_kind(path)?)
    } else {
        bail!("{} does not exist", path.display())
    }
}

/// A bundle's own precision, or fp32 for a checkpoint (unused there).
fn bundle_precision(path: &std::path::Path) -> Result<Precision> {
    if path.join(anemone_models::bundle::MANIFEST_FILE).is_file() {
        let manifest = anemone_models::bundle::read_manifest(path)
            .with_context(|| format!("reading bundle {}", path.display()))?;
        Ok(manifest.conversion.precision)
    } else {
        Ok(Precision::Fp32)
    }
}
