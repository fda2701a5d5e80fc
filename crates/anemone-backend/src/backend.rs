//! The one thing a pipeline needs from an execution engine: load a package, make its state,
//! predict a function with named inputs.

use std::collections::HashMap;
use std::path::Path;

use crate::tensor::Tensor;

/// A function's outputs by name, and the first op whose output held a non-finite value
/// (`name (type)`), when the backend can tell.
pub type CheckedOutputs = (HashMap<String, Tensor>, Option<String>);

/// An engine that runs `.mlpackage` files as written to disk.
///
/// Tensors cross the boundary as [`Tensor`] (values held as f32 whatever the declared dtype;
/// the declared dtype and shape must match the function's signature).
///
/// Engines are shared between threads (a server runs one session per request on one loaded
/// bundle), hence the `Send`/`Sync` bounds.
pub trait Backend: Send + Sync + 'static {
    /// A loaded, ready-to-run package.
    type Package: Send + Sync;
    /// The values of a package's states (the KV cache of a decoder chunk).
    type State: Send;
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
