//! A converted bundle run chunk by chunk on a [`Backend`]: host embedding → decoder chunks in
//! layer order (prefill in `prefill_len` windows, decode one token at a time; RoPE tables, mask
//! and KV write position made on the host) → final norm + LM head (host or package) → logits.
//!
//! [`Pipeline`] holds the loaded packages and host weights; a [`Session`] owns the KV states of
//! one sequence and implements [`crate::LogitsModel`], so generation, sampling, chat templates and
//! teacher forcing run unchanged on a bundle.

mod host;
mod session;

pub use host::HostWeights;
pub use session::{FeedTrace, Session};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anemone_backend::Backend;
use anemone_checkpoint::TokenizerBundle;
use anemone_exec::team::Team;
use anemone_mil::DType;
use anemone_models::ane::names;
use anemone_models::bundle::{self, BundleError, FileCheck, Manifest};

/// Errors opening or running a bundle; each names the file, package, function or token.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(
        "{}: {} file(s) do not match the manifest's sha256 (first: {}); the bundle was modified \
         or is incomplete",
        dir.display(), failures.len(), describe_check(&failures[0])
    )]
    Verify {
        dir: PathBuf,
        failures: Vec<FileCheck>,
    },
    #[error("{}: manifest: {problem}", dir.display())]
    Manifest { dir: PathBuf, problem: String },
    #[error(
        "{}: the manifest disagrees with the package: {} (the bundle was edited after it was \
         written; convert it again)",
        package.display(), problems.join("; ")
    )]
    Signature {
        package: PathBuf,
        problems: Vec<String>,
    },
    #[error("{}: tensor `{tensor}`: {problem}", path.display())]
    Host {
        path: PathBuf,
        tensor: String,
        problem: String,
    },
    #[error("{}: {problem}", path.display())]
    Tokenizer { path: PathBuf, problem: String },
    #[error("{backend}: {}: function `{function}`: {source}", package.display())]
    Backend {
        backend: String,
        package: PathBuf,
        function: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("{}: function `{function}`: output `{output}`: {problem}", package.display())]
    Output {
        package: PathBuf,
        function: String,
        output: String,
        problem: String,
    },
    #[error(
        "context overflow: {requested} token(s) at position {position} exceed the bundle's \
         context of {context} (convert with a larger --context)"
    )]
    ContextOverflow {
        position: usize,
        requested: usize,
        context: usize,
    },
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    TokenOutOfRange { token: u32, vocab_size: usize },
    #[error("feed called with no token ids")]
    EmptyInput,
    #[error("cannot start a thread pool of {threads} thread(s): {problem}")]
    ThreadPool { threads: usize, problem: String },
}

fn describe_check(c: &FileCheck) -> String {
    match (&c.expected_sha256, &c.found_sha256) {
        (Some(_), None) => format!("{} is missing", c.path),
        (None, Some(_)) => format!("{} is not listed", c.path),
        _ => format!("{} differs", c.path),
    }
}

#[derive(Debug, Clone)]
pub struct PipelineOptions {
    /// Hash every file and compare with the manifest, and check every package's functions
    /// (inputs, outputs, states: names, dtypes, shapes) against the manifest, before loading
    /// (default on).
    pub verify_hashes: bool,
    /// Threads of the host work (LM head): the process's team of that many threads, which an
    /// executor of the same `--threads` runs its matvecs on too (no oversubscription); `None`
    /// = as many as the global rayon pool.
    pub host_threads: Option<usize>,
    /// Load the tokenizer after the packages, not before (default off): for a caller that
    /// frees it once the prompt is encoded (`generate`), its blocks then lie above the
    /// packages' in the heap and are freed as one stretch the allocator can return, not as
    /// holes between the packages' blocks that stay resident. A caller that keeps it would
    /// only add its parse's transient (tens of MiB of small blocks) on top of all else loaded.
    pub tokenizer_after_packages: bool,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        PipelineOptions {
            verify_hashes: true,
            host_threads: None,
            tokenizer_after_packages: false,
        }
    }
}

/// One loaded decoder chunk.
pub(crate) struct LoadedChunk<P> {
    pub package: P,
    pub path: PathBuf,
    /// Global index of the layer after the chunk's last (its output is the residual stream
    /// after layer `end_layer - 1`).
    pub end_layer: usize,
}

/// Where the time of [`Pipeline::open`] went, seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LoadTimings {
    /// Reading the manifest and checking every file's sha256 (0 with `verify_hashes` off).
    pub verify_s: f64,
    /// Host weights (embedding, final norm, LM head) and the tokenizer.
    pub host_s: f64,
    /// Every package loaded on the backend, its compilation apart: the executor parses it;
    /// Core ML loads the compiled model.
    pub packages_s: f64,
    /// Compiling packages into the backend's own form (Core ML: `.mlpackage` → `.mlmodelc`, 0
    /// for a package found in its compiled-model cache); 0 for the executor.
    pub compile_s: f64,
    /// How many packages the engine's compiled-model cache had (`hits`) and had not
    /// (`misses`, compiled on this load); `None` for an engine without such a cache (the
    /// executor) or with it bypassed (Core ML's `--no-cache`).
    pub compile_cache: Option<CompileCache>,
}

/// Hits and misses of a compiled-model cache over the packages of one load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompileCache {
    pub hits: usize,
    pub misses: usize,
}

impl CompileCache {
    /// Counts the loads that consulted a cache (`Some`); `None` when none did.
    pub fn of(reports: impl IntoIterator<Item = Option<bool>>) -> Option<Self> {
        reports.into_iter().flatten().fold(None, |counts, hit| {
            let mut c: CompileCache = counts.unwrap_or_default();
            match hit {
                true => c.hits += 1,
                false => c.misses += 1,
            }
            Some(c)
        })
    }
}

/// A bundle loaded on a backend.
pub struct Pipeline<B: Backend> {
    load_timings: LoadTimings,
    backend: B,
    dir: PathBuf,
    manifest: Manifest,
    host: HostWeights,
    chunks: Vec<LoadedChunk<B::Package>>,
    lm_head: Option<(PathBuf, B::Package)>,
    tokenizer: Option<TokenizerBundle>,
    /// dtype of the chunk functions' float inputs (the bundle precision).
    activation_dtype: DType,
    /// The team the host's LM head runs on (`None`: the calling thread's team, as wide as its
    /// rayon pool).
    host_team: Option<Arc<Team>>,
}

impl<B: Backend> std::fmt::Debug for Pipeline<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("backend", &self.backend.name())
            .field("dir", &self.dir)
            .field("chunks", &self.chunks.len())
            .field("context", &self.manifest.conversion.context)
            .finish()
    }
}

impl<B: Backend> Pipeline<B> {
    /// Reads `dir/anemone.json`, checks every file's sha256 (unless disabled), loads the host
    /// weights, the tokenizer and every package on `backend`.
    pub fn open(dir: &Path, backend: B, options: &PipelineOptions) -> Result<Self, PipelineError> {
        let opened = std::time::Instant::now();
        let manifest = bundle::read_manifest(dir)?;
        if options.verify_hashes {
            let failures: Vec<FileCheck> = bundle::verify_files(dir, &manifest)?
                .into_iter()
                .filter(|c| !c.ok)
                .collect();
            if !failures.is_empty() {
                return Err(PipelineError::Verify {
                    dir: dir.to_path_buf(),
                    failures,
                });
            }
        }
        check_manifest(dir, &manifest)?;
        if options.verify_hashes {
            check_signatures(dir, &manifest)?;
        }
        let verify_s = opened.elapsed().as_secs_f64();
        let host_started = std::time::Instant::now();
        let host = HostWeights::load(dir, &manifest)?;
        let mut tokenizer = if options.tokenizer_after_packages {
            None
        } else {
            host::load_tokenizer(dir, &manifest)?
        };
        let mut host_s = host_started.elapsed().as_secs_f64();
        let packages_started = std::time::Instant::now();
        let activation_dtype = manifest.conversion.precision.dtype();
        let mut compile_s = 0.0;
        // With verified hashes the manifest identifies every package's content: a backend that
        // caches compiled packages keys them by it instead of hashing the package again.
        let mut cache_reports = Vec::new();
        let mut load = |relative: &str| -> Result<(PathBuf, B::Package), PipelineError> {
            let path = dir.join(relative);
            let key = options.verify_hashes.then(|| {
                anemone_coreml::cache::content_key_under(
                    manifest
                        .files
                        .iter()
                        .map(|(p, f)| (p.as_str(), f.sha256.as_str())),
                    relative,
                )
            });
            let (package, report) = backend
                .load_identified(&path, key.flatten().as_deref())
                .map_err(|e| backend_error(&backend, &path, "(load)", e))?;
            compile_s += report.compile_s;
            cache_reports.push(report.cache_hit);
            Ok((path, package))
        };
        let mut chunks = Vec::with_capacity(manifest.chunks.len());
        for entry in &manifest.chunks {
            let started = std::time::Instant::now();
            let (path, package) = load(&entry.path)?;
            tracing::debug!(
                chunk = entry.index,
                elapsed_s = started.elapsed().as_secs_f64(),
                "chunk loaded"
            );
            chunks.push(LoadedChunk {
                package,
                path,
                end_layer: entry.first_layer + entry.layer_count,
            });
        }
        let lm_head = match &manifest.lm_head {
            Some(entry) => Some(load(&entry.path)?),
            None => None,
        };
        let packages_s = packages_started.elapsed().as_secs_f64() - compile_s;
        if options.tokenizer_after_packages {
            let tokenizer_started = std::time::Instant::now();
            tokenizer = host::load_tokenizer(dir, &manifest)?;
            host_s += tokenizer_started.elapsed().as_secs_f64();
        }
        let host_team = match options.host_threads {
            Some(threads) => {
                Some(
                    Team::shared(threads).map_err(|e| PipelineError::ThreadPool {
                        threads,
                        problem: e.to_string(),
                    })?,
                )
            }
            None => None,
        };
        Ok(Pipeline {
            load_timings: LoadTimings {
                verify_s,
                host_s,
                packages_s,
                compile_s,
                compile_cache: CompileCache::of(cache_reports),
            },
            host_team,
            backend,
            dir: dir.to_path_buf(),
            manifest,
            host,
            chunks,
            lm_head,
            tokenizer,
            activation_dtype,
        })
    }

    /// A new sequence with zeroed KV states.
    pub fn session(&self) -> Result<Session<'_, B>, PipelineError> {
        Session::new(self)
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Where the time of [`Pipeline::open`] went.
    pub fn load_timings(&self) -> LoadTimings {
        self.load_timings
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn tokenizer(&self) -> Option<&TokenizerBundle> {
        self.tokenizer.as_ref()
    }

    /// Moves the tokenizer out (for a caller that encodes once and then only decodes, and so
    /// can free it); [`Pipeline::tokenizer`] is `None` afterwards.
    pub fn take_tokenizer(&mut self) -> Option<TokenizerBundle> {
        self.tokenizer.take()
    }

    /// Tokens a session may hold.
    pub fn context(&self) -> usize {
        self.manifest.conversion.context
    }

    pub fn vocab_size(&self) -> usize {
        self.manifest.config.vocab_size
    }

    /// For each chunk, the number of layers before its output (chunk `i`'s output is the
    /// residual stream after layer `chunk_depths()[i] - 1`).
    pub fn chunk_depths(&self) -> Vec<usize> {
        self.chunks.iter().map(|c| c.end_layer).collect()
    }

    /// Ids that end generation: the bundle's EOS ids.
    pub fn stop_ids(&self) -> Vec<u32> {
        let mut ids = self.manifest.config.eos_token_ids.clone();
        if let Some(t) = &self.manifest.tokenizer {
            for id in &t.eos_token_ids {
                if !ids.contains(id) {
                    ids.push(*id);
                }
            }
        }
        ids
    }
}

pub(crate) fn backend_error<B: Backend>(
    backend: &B,
    package: &Path,
    function: &str,
    e: B::Error,
) -> PipelineError {
    PipelineError::Backend {
        backend: backend.name(),
        package: package.to_path_buf(),
        function: function.to_string(),
        source: Box::new(e),
    }
}

/// The chunk plan must cover the layers in order with the functions the pipeline calls.
/// Every package against the functions the manifest declares for it. Hashes prove the files are
/// the ones the manifest lists; this proves the manifest describes them (a manifest edited after
/// conversion, or packages swapped between bundles, would otherwise load and run wrongly).
fn check_signatures(dir: &Path, m: &Manifest) -> Result<(), PipelineError> {
    use rayon::prelude::*;
    let packages: Vec<(&str, &[anemone_models::ane::FunctionSignature])> = m
        .chunks
        .iter()
        .map(|c| (c.path.as_str(), c.functions.as_slice()))
        .chain(
            m.lm_head
                .iter()
                .map(|l| (l.path.as_str(), l.functions.as_slice())),
        )
        .collect();
    packages.par_iter().try_for_each(|(relative, declared)| {
        let package = dir.join(relative);
        // the model proto alone: the weights are not read
        let interfaces =
            anemone_mil::read_package_interface(&package).map_err(|e| PipelineError::Manifest {
                dir: dir.to_path_buf(),
                problem: format!("cannot read {relative}: {e}"),
            })?;
        let problems = bundle::interface_mismatches(declared, &interfaces);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(PipelineError::Signature { package, problems })
        }
    })
}

fn check_manifest(dir: &Path, m: &Manifest) -> Result<(), PipelineError> {
    let bad = |problem: String| {
        Err(PipelineError::Manifest {
            dir: dir.to_path_buf(),
            problem,
        })
    };
    let mut next = 0;
    for c in &m.chunks {
        if c.first_layer != next || c.layer_count == 0 {
            return bad(format!(
                "chunk {} covers layers {}..{}, expected to start at layer {next}",
                c.index,
                c.first_layer,
                c.first_layer + c.layer_count
            ));
        }
        next += c.layer_count;
        for function in [names::DECODE, names::PREFILL] {
            if !c.functions.iter().any(|f| f.name == function) {
                return bad(format!("chunk {} has no `{function}` function", c.index));
            }
        }
    }
    if next != m.config.num_hidden_layers {
        return bad(format!(
            "the chunks cover {next} layers, the model has {}",
            m.config.num_hidden_layers
        ));
    }
    let conv = &m.conversion;
    if conv.prefill_len == 0 || conv.prefill_len > conv.context {
        return bad(format!(
            "prefill_len {} is not between 1 and the context {}",
            conv.prefill_len, conv.context
        ));
    }
    if let Err(problem) = m.kv_layout().check(conv.prefill_len) {
        return bad(problem);
    }
    if m.lm_head.is_some() != (conv.lm_head == anemone_models::ane::LmHeadPlacement::Package) {
        return bad("lm_head placement and lm_head entry disagree".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::CompileCache;

    #[test]
    fn compile_cache_counts_only_loads_that_consulted_a_cache() {
        assert_eq!(
            CompileCache::of([None, None]),
            None,
            "the executor has none"
        );
        assert_eq!(CompileCache::of([]), None);
        assert_eq!(
            CompileCache::of([Some(true), Some(false), Some(true)]),
            Some(CompileCache { hits: 2, misses: 1 })
        );
        let json = serde_json::to_value(CompileCache { hits: 2, misses: 1 }).unwrap();
        assert_eq!(json, serde_json::json!({"hits": 2, "misses": 1}));
    }
}
