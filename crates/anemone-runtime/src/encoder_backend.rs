//! An encoder bundle's package on any engine of the backend registry
//! ([`crate::backend::with_backend`]): the [`Encoder`](crate::encoder::Encoder) holds it as a
//! [`BucketRunner`], so it does not depend on which engine runs the package.

use std::any::Any;
use std::collections::HashMap;
use std::path::Path;

use anemone_backend::{Backend, Precision, Tensor};
use anemone_exec::{ExecutorBackend, OpOutput};

use crate::backend::{with_backend, BackendChoice, BackendTask};
use crate::encoder::EncoderRunError;

/// Runs one function (a length bucket) of a loaded encoder package.
pub trait BucketRunner: Send + Sync {
    /// The engine, for messages (`executor-fp16`, `coreml-ane`, …).
    fn name(&self) -> String;
    /// The arithmetic the package's inputs are rounded to.
    fn precision(&self) -> Precision;
    /// Runs `function` on fresh state.
    fn predict(
        &self,
        function: &str,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<HashMap<String, Tensor>, EncoderRunError>;
    /// Like `predict`, showing every op's output to `observer` (the encoder gate's per-layer
    /// comparison). Only the executor can see inside a package; other engines are an error.
    fn predict_observed(
        &self,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        observer: &mut dyn FnMut(OpOutput<'_>),
    ) -> Result<HashMap<String, Tensor>, EncoderRunError>;
    fn as_any(&self) -> &dyn Any;
}

struct BackendRunner<B: Backend> {
    backend: B,
    package: B::Package,
    precision: Precision,
}

impl<B: Backend> BackendRunner<B> {
    fn error(&self, source: B::Error) -> EncoderRunError {
        EncoderRunError::Backend {
            backend: self.backend.name(),
            source: Box::new(source),
        }
    }
}

impl<B: Backend> BucketRunner for BackendRunner<B> {
    fn name(&self) -> String {
        self.backend.name()
    }

    fn precision(&self) -> Precision {
        self.precision
    }

    fn predict(
        &self,
        function: &str,
        inputs: &HashMap<String, Tensor>,
    ) -> Result<HashMap<String, Tensor>, EncoderRunError> {
        let mut state = self
            .backend
            .new_state(&self.package, function)
            .map_err(|e| self.error(e))?;
        self.backend
            .predict(&self.package, function, inputs, &mut state)
            .map_err(|e| self.error(e))
    }

    fn predict_observed(
        &self,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        observer: &mut dyn FnMut(OpOutput<'_>),
    ) -> Result<HashMap<String, Tensor>, EncoderRunError> {
        let Some(exec) = self
            .as_any()
            .downcast_ref::<BackendRunner<ExecutorBackend>>()
        else {
            return Err(EncoderRunError::Observe {
                backend: self.backend.name(),
            });
        };
        let mut state = exec.package.new_state(function)?;
        Ok(exec
            .package
            .predict_observed(function, inputs, &mut state, observer)?)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Loads the package at `path` on the engine `choice` names.
pub fn load_runner(
    path: &Path,
    choice: &BackendChoice,
) -> Result<Box<dyn BucketRunner>, EncoderRunError> {
    struct Load<'a> {
        path: &'a Path,
        precision: Precision,
    }
    impl BackendTask for Load<'_> {
        type Output = Result<Box<dyn BucketRunner>, EncoderRunError>;
        fn run<B: Backend>(self, backend: B) -> Self::Output {
            let package = backend
                .load(self.path)
                .map_err(|e| EncoderRunError::Backend {
                    backend: backend.name(),
                    source: Box::new(e),
                })?;
            Ok(Box::new(BackendRunner {
                backend,
                package,
                precision: self.precision,
            }))
        }
    }
    with_backend(
        choice,
        Load {
            path,
            precision: choice.precision,
        },
    )
    .map_err(|e| EncoderRunError::Registry(Box::new(e)))?
}
