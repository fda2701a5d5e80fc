//! The executor as an implementation of the backend contract ([`anemone_backend::Backend`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anemone_backend::{Backend, CheckedOutputs, Tensor};
use anemone_mil::Precision;

use crate::error::ExecError;
use crate::package::{LoadedPackage, State};

/// The MIL executor in fp32 or fp16-faithful arithmetic, on the global rayon pool or its own.
#[derive(Clone)]
pub struct ExecutorBackend {
    pub precision: Precision,
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
    pub fn new(precision: Precision) -> Self {
        ExecutorBackend {
            precision,
            pool: None,
        }
    }

    /// Runs every predict on a pool of `threads` threads.
    pub fn with_threads(
        precision: Precision,
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
    type Package = LoadedPackage;
    type State = State;
    type Error = ExecError;

    fn name(&self) -> String {
        format!("executor-{}", self.precision.name())
    }

    fn load(&self, path: &Path) -> Result<Self::Package, Self::Error> {
        LoadedPackage::load(path, self.precision)
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
