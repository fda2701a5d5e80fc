//! The one thing a pipeline needs from an execution engine: load a package, make its state,
//! predict a function with named inputs, and hand activations from one package to the next in
//! buffers the engine owns.

use std::collections::HashMap;
use std::path::Path;

use anemone_mil::DType;

use crate::tensor::Tensor;

/// A function's outputs by name, and the first op whose output held a non-finite value
/// (`name (type)`), when the backend can tell.
pub type CheckedOutputs = (HashMap<String, Tensor>, Option<String>);

/// What loading one package cost besides reading it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadReport {
    /// Seconds spent compiling the package into the engine's own form (Core ML's `.mlmodelc`);
    /// 0 for an engine that compiles nothing, or when the compiled form came from a cache.
    pub compile_s: f64,
    /// Whether the compiled form came from the engine's cache (`None`: the engine has none).
    pub cache_hit: Option<bool>,
}

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
    /// Activations the engine owns between predictions (one chunk's output given as the next
    /// chunk's input without a trip through the host): the executor's is a plain [`Tensor`];
    /// Core ML's an IOSurface-backed fp16 `MLMultiArray` that predictions write as an output
    /// backing. A buffer belongs to one session (predictions write into it).
    type Buffer: Send;
    type Error: std::error::Error + Send + Sync + 'static;

    /// A short name for messages and reports (`executor-fp16`, `coreml-ane`, …).
    fn name(&self) -> String;
    fn load(&self, path: &Path) -> Result<Self::Package, Self::Error>;
    /// Like [`Backend::load`] for a package whose files the caller has already verified:
    /// `content_key` identifies their content (built from a bundle manifest's sha256s), so an
    /// engine that caches compiled forms keys them by it instead of hashing the package again.
    /// Also says what compiling cost. The default (an engine with nothing to compile) loads.
    fn load_identified(
        &self,
        path: &Path,
        content_key: Option<&str>,
    ) -> Result<(Self::Package, LoadReport), Self::Error> {
        let _ = content_key;
        Ok((self.load(path)?, LoadReport::default()))
    }
    /// Fresh (zeroed) state for every state `function` declares.
    fn new_state(
        &self,
        package: &Self::Package,
        function: &str,
    ) -> Result<Self::State, Self::Error>;
    /// Sets every value of `state` back to zero (a new sequence).
    fn reset_state(&self, state: &mut Self::State);
    /// Bytes one element of a state declared `dtype` takes in this engine's states (memory
    /// budgets); an engine that does not say is counted at f32's four (the larger count).
    fn state_element_bytes(&self, dtype: DType) -> usize {
        let _ = dtype;
        std::mem::size_of::<f32>()
    }
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

    /// A zeroed buffer of `dtype` (fp16 or fp32) and `shape`.
    fn new_buffer(&self, dtype: DType, shape: &[usize]) -> Result<Self::Buffer, Self::Error>;

    /// Writes host values into a buffer (`values` of the buffer's dtype and shape).
    fn write_buffer(&self, buffer: &mut Self::Buffer, values: &Tensor) -> Result<(), Self::Error>;

    /// A buffer's values in row-major order (read through its strides where the engine pads
    /// rows): what the host reads only where it needs values.
    fn read_buffer(&self, buffer: &Self::Buffer) -> Result<Tensor, Self::Error>;

    /// Copies position `position` of `from` (`[1, C, 1, T]`, the BC1S layout) into `to`
    /// (`[1, C, 1, 1]`, same dtype) inside the engine: the last token's hidden state handed to
    /// the LM-head package without a trip through the host.
    fn copy_position(
        &self,
        from: &Self::Buffer,
        position: usize,
        to: &mut Self::Buffer,
    ) -> Result<(), Self::Error>;

    /// Runs `function` like [`Backend::predict`] with `inputs` plus the buffers of
    /// `buffer_inputs` (by input name), writing the outputs named in `buffer_outputs` into those
    /// buffers (which must have the outputs' dtype and shape) instead of returning them; the
    /// other outputs come back as tensors. With `checked`, also names the first op whose output
    /// held a non-finite value, as [`Backend::predict_checked`] does.
    #[allow(clippy::too_many_arguments)]
    fn predict_buffers(
        &self,
        package: &Self::Package,
        function: &str,
        inputs: &mut HashMap<String, Tensor>,
        buffer_inputs: &mut [(&str, &mut Self::Buffer)],
        buffer_outputs: &mut [(&str, &mut Self::Buffer)],
        state: &mut Self::State,
        checked: bool,
    ) -> Result<CheckedOutputs, Self::Error>;
}
