//! The one thing a pipeline needs from an execution engine: load a package, make its state,
//! predict a function with named inputs. Implemented by the MIL executor (any OS); a Core ML
//! backend implements the same trait on macOS.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub use anemone_exec::{Precision as ExecPrecision, Tensor};

/// A function's outputs by name, and the first op whose output held a non-finite value
/// (`name (type)`), when the backend can tell.
pub type CheckedOutputs = (HashMap<String, Tensor>, Option<String>);

/// An engine that runs `.mlpackage` files as written to disk.
///
/// Tensors cross the boundary as [`Tensor`] (values held as f32 whatever the declared dtype;
/// the declared dtype and shape must match the function's signature).
pub trait Backend {
    /// A loaded, ready-to-run package.
    type Package;
    /// The values of a package's states (the KV cache of a decoder chunk).
    type State;
    type Error: std::error::Error + Send + Sync + 'static;

    /// A short name for messages and reports (`executor-fp16`, `coreml-ane`, …).
    fn name(&self) -> String;
    fn load(&self, path: &Path) -> Result<Self::Package, Self::Error>;
    /// Fresh (zeroed) state for every state `function` declares.
    fn new_state(
        &self,
        package: &Self::Package,
        function: &str,
    ) -> Result<Self::State, Self::Error>;
    /// Sets every value of `state` back to zero (a new sequence).
    fn reset_state(&self, state: &mut Self::State);
    /// Runs `function`, reading and writing `state`; returns its outputs by name.
    fn predict(
        &self,
        package: &Self::Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut Self::State,
    ) -> Result<HashMap<String, Tensor>, Self::Error>;

    /// Like [`Backend::predict`], also naming the first op (in program order) whose output held
    /// a non-finite value, as `name (type)`, where the backend can see inside a package. The
    /// default, for a backend that cannot (Core ML), runs `predict` and names none.
    fn predict_checked(
        &self,
        package: &Self::Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut Self::State,
    ) -> Result<CheckedOutputs, Self::Error> {
        Ok((self.predict(package, function, inputs, state)?, None))
    }
}

/// The executor precision matching a bundle's conversion precision (fp16 bundles run in the
/// ANE's fp16 arithmetic, fp32 bundles in fp32).
pub fn native_precision(bundle: anemone_models::ane::Precision) -> ExecPrecision {
    match bundle {
        anemone_models::ane::Precision::Fp16 => ExecPrecision::Fp16,
        anemone_models::ane::Precision::Fp32 => ExecPrecision::Fp32,
    }
}

/// The MIL executor ([`anemone_exec`]) in fp32 or fp16-faithful arithmetic, on the global rayon
/// pool or its own.
#[derive(Clone)]
pub struct ExecutorBackend {
    pub precision: ExecPrecision,
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl std::fmt::Debug for ExecutorBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorBackend")
            .field("precision", &self.precision)
            .field(
                "threads",
                &self.pool.as_ref().map(|p| p.current_num_threads()),
            )
            .finish()
    }
}

impl ExecutorBackend {
    /// Runs on the global rayon pool (all cores unless `RAYON_NUM_THREADS` says otherwise).
    pub fn new(precision: ExecPrecision) -> Self {
        ExecutorBackend {
            precision,
            pool: None,
        }
    }

    /// Runs every predict on a pool of `threads` threads.
    pub fn with_threads(
        precision: ExecPrecision,
        threads: usize,
    ) -> Result<Self, rayon::ThreadPoolBuildError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("anemone-exec-{i}"))
            .build()?;
        Ok(ExecutorBackend {
            precision,
            pool: Some(Arc::new(pool)),
        })
    }
}

impl Backend for ExecutorBackend {
    type Package = anemone_exec::LoadedPackage;
    type State = anemone_exec::State;
    type Error = anemone_exec::ExecError;

    fn name(&self) -> String {
        format!("executor-{}", self.precision.name())
    }

    fn load(&self, path: &Path) -> Result<Self::Package, Self::Error> {
        anemone_exec::LoadedPackage::load(path, self.precision)
    }

    fn new_state(
        &self,
        package: &Self::Package,
        function: &str,
    ) -> Result<Self::State, Self::Error> {
        package.new_state(function)
    }

    fn reset_state(&self, state: &mut Self::State) {
        state.reset()
    }

    fn predict(
        &self,
        package: &Self::Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut Self::State,
    ) -> Result<HashMap<String, Tensor>, Self::Error> {
        match &self.pool {
            Some(pool) => pool.install(|| package.predict(function, inputs, state)),
            None => package.predict(function, inputs, state),
        }
    }

    fn predict_checked(
        &self,
        package: &Self::Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut Self::State,
    ) -> Result<CheckedOutputs, Self::Error> {
        let mut first_non_finite = None;
        let mut run = || {
            package.predict_observed(function, inputs, state, &mut |o| {
                if first_non_finite.is_none() && o.tensor.data.iter().any(|v| !v.is_finite()) {
                    first_non_finite = Some(format!("{} ({})", o.op, o.op_type));
                }
            })
        };
        let outputs = match &self.pool {
            Some(pool) => pool.install(run)?,
            None => run()?,
        };
        Ok((outputs, first_non_finite))
    }
}
