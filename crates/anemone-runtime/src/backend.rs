//! The registry of execution engines a bundle can run on: [`BackendKind`] names them (as
//! `--backend` spells them) and [`run_on_backend`] is the one place a kind becomes a running
//! [`Pipeline`]. The contract an engine implements is [`anemone_backend::Backend`].

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use anemone_backend::Backend;
use anemone_exec::ExecutorBackend;
pub use anemone_exec::{Accumulation, Arithmetic};
use anemone_mil::Precision;

use crate::pipeline::{Pipeline, PipelineError, PipelineOptions};

/// The execution engines a bundle can run on.
///
/// Closed on purpose: a new engine becomes a variant here, an entry of [`BackendKind::ALL`] and
/// an arm of [`run_on_backend`]; the compiler then points at every other match on the kind.
/// `CoreMl` exists only on Apple targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum BackendKind {
    /// The MIL executor of `anemone-exec`: a CPU interpreter of the packages as written to
    /// disk, in fp16-faithful or fp32 arithmetic, on any OS.
    #[default]
    Executor,
    /// Core ML (`anemone-coreml`): the Neural Engine, GPU or CPU as `--compute-units` says.
    /// Only on Apple targets.
    #[cfg(target_vendor = "apple")]
    CoreMl,
}

impl BackendKind {
    #[cfg(not(target_vendor = "apple"))]
    pub const ALL: [BackendKind; 1] = [BackendKind::Executor];
    #[cfg(target_vendor = "apple")]
    pub const ALL: [BackendKind; 2] = [BackendKind::Executor, BackendKind::CoreMl];

    /// The engine a bundle runs on when `--backend` is not given: Core ML where it exists
    /// (macOS, iOS), the executor elsewhere.
    pub fn for_bundles() -> BackendKind {
        #[cfg(target_vendor = "apple")]
        {
            BackendKind::CoreMl
        }
        #[cfg(not(target_vendor = "apple"))]
        {
            BackendKind::Executor
        }
    }

    /// The name `--backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Executor => "executor",
            #[cfg(target_vendor = "apple")]
            BackendKind::CoreMl => "coreml",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend name that [`BackendKind::ALL`] does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{name}` (one of: {})", known_backends())]
pub struct UnknownBackend {
    pub name: String,
}

fn known_backends() -> String {
    let names: Vec<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
    names.join(", ")
}

impl FromStr for BackendKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        BackendKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownBackend {
                name: s.to_string(),
            })
    }
}

/// Where and how a bundle runs: the engine, its arithmetic, its threads (`None`: all cores).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendChoice {
    pub kind: BackendKind,
    pub precision: Precision,
    /// Executor only: how sums inside ops accumulate (`--precision fp16-acc`).
    pub accumulation: Accumulation,
    pub threads: Option<usize>,
    /// Core ML only: the devices it may use.
    pub compute_units: anemone_coreml::ComputeUnits,
    /// Core ML only: compile every package afresh instead of using the compiled-model cache.
    pub no_cache: bool,
}

impl BackendChoice {
    /// The arithmetic `--precision` names for this choice.
    pub fn arithmetic(&self) -> Arithmetic {
        match (self.precision, self.accumulation) {
            (Precision::Fp16, Accumulation::F32) => Arithmetic::Fp16,
            (Precision::Fp16, Accumulation::Fp16Blocks) => Arithmetic::Fp16Acc,
            (Precision::Fp32, Accumulation::F32 | Accumulation::Fp16Blocks) => Arithmetic::Fp32,
        }
    }

    /// `kind` in `precision` on all cores, Core ML on its defaults (Neural Engine, cache on).
    pub fn new(kind: BackendKind, precision: Precision) -> Self {
        BackendChoice {
            kind,
            precision,
            accumulation: Accumulation::F32,
            threads: None,
            compute_units: anemone_coreml::ComputeUnits::default(),
            no_cache: false,
        }
    }
}

/// Work done with an open pipeline, whatever engine runs it. [`Backend`] has associated types,
/// so each engine makes its own `Pipeline<B>` type: callers hand [`run_on_backend`] a task
/// generic over `B` instead of receiving a pipeline.
pub trait PipelineTask {
    type Output;
    fn run<B: Backend>(self, pipeline: Pipeline<B>) -> Self::Output;
}

/// Work done with a bare engine (packages that are not a decoder pipeline: an encoder bundle's
/// one package), generic over `B` for the same reason as [`PipelineTask`].
pub trait BackendTask {
    type Output;
    fn run<B: Backend>(self, backend: B) -> Self::Output;
}

/// Makes the engine `choice` names and runs `task` with it. The one place a [`BackendKind`]
/// becomes an engine.
pub fn with_backend<T: BackendTask>(
    choice: &BackendChoice,
    task: T,
) -> Result<T::Output, PipelineError> {
    match choice.kind {
        BackendKind::Executor => {
            let backend =
                match choice.threads {
                    Some(threads) => ExecutorBackend::with_threads(choice.precision, threads)
                        .map_err(|e| PipelineError::ThreadPool {
                            threads,
                            problem: e.to_string(),
                        })?,
                    None => ExecutorBackend::new(choice.precision),
                };
            let backend = backend.with_accumulation(choice.accumulation);
            Ok(task.run(backend))
        }
        #[cfg(target_vendor = "apple")]
        BackendKind::CoreMl => {
            let backend = anemone_coreml::CoreMlBackend::new(anemone_coreml::CoreMlOptions {
                compute_units: choice.compute_units,
                no_cache: choice.no_cache,
                cache_dir: None,
            });
            Ok(task.run(backend))
        }
    }
}

/// Opens the bundle at `dir` on the engine `choice` names and runs `task` on the pipeline.
pub fn run_on_backend<T: PipelineTask>(
    dir: &Path,
    choice: &BackendChoice,
    options: &PipelineOptions,
    task: T,
) -> Result<T::Output, PipelineError> {
    struct OpenPipeline<'a, T> {
        dir: &'a Path,
        options: &'a PipelineOptions,
        task: T,
    }
    impl<T: PipelineTask> BackendTask for OpenPipeline<'_, T> {
        type Output = Result<T::Output, PipelineError>;
        fn run<B: Backend>(self, backend: B) -> Self::Output {
            Ok(self
                .task
                .run(Pipeline::open(self.dir, backend, self.options)?))
        }
    }
    with_backend(choice, OpenPipeline { dir, options, task })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_name_parses_back_to_its_kind() {
        for kind in BackendKind::ALL {
            assert_eq!(kind.name().parse::<BackendKind>(), Ok(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        assert_eq!("executor".parse::<BackendKind>(), Ok(BackendKind::Executor));
        assert_eq!(BackendKind::default(), BackendKind::Executor);
        #[cfg(not(target_vendor = "apple"))]
        assert_eq!(BackendKind::for_bundles(), BackendKind::Executor);
    }

    #[cfg(not(target_vendor = "apple"))]
    #[test]
    fn an_unknown_backend_name_lists_the_known_ones() {
        let err = "coreml".parse::<BackendKind>().unwrap_err();
        assert_eq!(
            err,
            UnknownBackend {
                name: "coreml".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "unknown backend `coreml` (one of: executor)"
        );
        assert!("Executor".parse::<BackendKind>().is_err());
        assert!("".parse::<BackendKind>().is_err());
    }
}
