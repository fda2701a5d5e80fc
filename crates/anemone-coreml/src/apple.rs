//! The Apple layer: `MLModel` compile/load/predict, `MLState`, output backings, `MLComputePlan`.
//! Type-checked for aarch64-apple-darwin by `scripts/check-apple.sh`; never run in this
//! repository's CI (no Mac).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use anemone_backend::{Backend, CheckedOutputs, LoadReport, Tensor};
use anemone_mil::DType;
use objc2::rc::Retained;
use objc2::runtime::{AnyObject, ProtocolObject};
use objc2::AnyThread;
use objc2_core_ml::{
    MLComputePlan, MLComputeUnits, MLDictionaryFeatureProvider, MLFeatureProvider, MLFeatureValue,
    MLModel, MLModelConfiguration, MLMultiArray, MLMultiArrayDataType, MLPredictionOptions,
    MLState,
};
use objc2_foundation::{NSDictionary, NSError, NSProcessInfo, NSString, NSURL};

use crate::apple_arrays::{ns_shape, read_multiarray, to_multiarray, write_array, CoreMlBuffer};
use crate::plan::{Device, OpPlan, PackagePlan};
use crate::{
    cache, Availability, ComputeUnits, CoreMlError, CoreMlOptions, MIN_MACOS_PLAN,
    MIN_MACOS_STATEFUL,
};

fn os_version() -> (u32, u32, String) {
    let v = NSProcessInfo::processInfo().operatingSystemVersion();
    let (major, minor) = (v.majorVersion as u32, v.minorVersion as u32);
    (major, minor, format!("{major}.{minor}.{}", v.patchVersion))
}

pub(crate) fn availability() -> Availability {
    let (major, minor, text) = os_version();
    let (available, reason) = if (major, minor) >= MIN_MACOS_STATEFUL || !cfg!(target_os = "macos")
    {
        (true, None)
    } else {
        (
            false,
            Some(format!(
                "macOS {text} is older than {}.{}, the first with stateful multi-function models",
                MIN_MACOS_STATEFUL.0, MIN_MACOS_STATEFUL.1
            )),
        )
    };
    Availability {
        available,
        os_version: Some(text),
        reason,
    }
}

pub(crate) fn ns_error(e: &NSError) -> String {
    e.localizedDescription().to_string()
}

fn url(path: &Path) -> Retained<NSURL> {
    NSURL::from_file_path(path)
        .unwrap_or_else(|| NSURL::fileURLWithPath(&NSString::from_str(&path.to_string_lossy())))
}

fn units(u: ComputeUnits) -> MLComputeUnits {
    match u {
        ComputeUnits::Ane => MLComputeUnits::CPUAndNeuralEngine,
        ComputeUnits::Gpu => MLComputeUnits::CPUAndGPU,
        ComputeUnits::Cpu => MLComputeUnits::CPUOnly,
        ComputeUnits::All => MLComputeUnits::All,
    }
}

/// Bundles on Core ML.
#[derive(Debug, Clone)]
pub struct CoreMlBackend {
    options: CoreMlOptions,
    cache_root: PathBuf,
}

impl CoreMlBackend {
    pub fn new(options: CoreMlOptions) -> Self {
        let cache_root = options
            .cache_dir
            .clone()
            .unwrap_or_else(cache::default_root);
        CoreMlBackend {
            options,
            cache_root,
        }
    }

    /// The package compiled to `.mlmodelc`: from the cache, or compiled now (and cached unless
    /// `no_cache`), timed apart from the load. `content_key` (from a verified bundle manifest)
    /// names the cache entry; without one the package's files are hashed. The second value
    /// keeps a temporary compiled model alive.
    fn compiled(
        &self,
        package: &Path,
        content_key: Option<&str>,
    ) -> Result<(PathBuf, Option<PathBuf>, LoadReport), CoreMlError> {
        let key = match (self.options.no_cache, content_key) {
            (true, _) => None,
            (false, Some(key)) => Some(key.to_string()),
            (false, None) => Some(cache::package_hash(package)?),
        };
        let dest = key.map(|key| cache::compiled_path(&self.cache_root, &key));
        if let Some(dest) = dest.as_ref().filter(|d| d.is_dir()) {
            tracing::debug!(package = %package.display(), compiled = %dest.display(), "cache hit");
            let report = LoadReport {
                compile_s: 0.0,
                cache_hit: Some(true),
            };
            return Ok((dest.clone(), None, report));
        }
        let started = std::time::Instant::now();
        #[allow(deprecated)] // the synchronous form; the caller is not the main thread
        // SAFETY: a file URL; Core ML returns the compiled model's temporary location.
        let compiled = unsafe { MLModel::compileModelAtURL_error(&url(package)) }.map_err(|e| {
            CoreMlError::Compile {
                package: package.to_path_buf(),
                message: ns_error(&e),
            }
        })?;
        let compiled = compiled
            .to_file_path()
            .ok_or_else(|| CoreMlError::Compile {
                package: package.to_path_buf(),
                message: "Core ML returned a compiled model that is not a file".into(),
            })?;
        let report = LoadReport {
            compile_s: started.elapsed().as_secs_f64(),
            // a miss, or no cache consulted at all (`--no-cache`)
            cache_hit: dest.as_ref().map(|_| false),
        };
        tracing::info!(
            package = %package.display(),
            seconds = report.compile_s,
            "compiled"
        );
        let Some(dest) = dest else {
            return Ok((compiled.clone(), Some(compiled), report));
        };
        cache::install(package, &compiled, &dest)?;
        let _ = std::fs::remove_dir_all(&compiled);
        Ok((dest, None, report))
    }

    fn configuration(&self, function: Option<&str>) -> Retained<MLModelConfiguration> {
        // SAFETY: a fresh configuration object, set before any model uses it.
        unsafe {
            let config = MLModelConfiguration::new();
            config.setComputeUnits(units(self.options.compute_units));
            if let Some(function) = function {
                config.setFunctionName(Some(&NSString::from_str(function)));
            }
            config
        }
    }
}

/// A compiled, loaded package: one `MLModel` per function (`functionName`), predictions on it
/// serialized (Core ML's contract for a model shared by sessions).
pub struct CoreMlPackage {
    path: PathBuf,
    compiled: PathBuf,
    models: HashMap<String, Retained<MLModel>>,
    /// Output name, declared shape and array type, per function.
    outputs: HashMap<String, Vec<DeclaredOutput>>,
    /// fp16 output backings, reused across predictions, per (function, output).
    backings: Mutex<HashMap<(String, String), Retained<MLMultiArray>>>,
    /// Held around every call into Core ML with this package's models (shared by its states).
    serial: Arc<Mutex<()>>,
    /// A compiled model outside the cache (`--no-cache`), removed on drop.
    temporary: Option<PathBuf>,
}

impl std::fmt::Debug for CoreMlPackage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreMlPackage")
            .field("path", &self.path)
            .field("compiled", &self.compiled)
            .field("functions", &self.models.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Drop for CoreMlPackage {
    fn drop(&mut self) {
        if let Some(dir) = &self.temporary {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// One session's state of a package: an `MLState` and the model that makes a fresh one.
pub struct CoreMlState {
    state: Retained<MLState>,
    model: Retained<MLModel>,
    /// The package's lock, held while the state is made anew.
    serial: Arc<Mutex<()>>,
}

// SAFETY: Core ML objects are reference-counted Objective-C objects whose retain and release are
// thread-safe; every call into Core ML with a package's models or output backings (predict,
// newState) holds the package's `serial` lock, so no two threads use them at once, and after
// loading the maps are only read. objc2 marks the types !Send/!Sync conservatively.
unsafe impl Send for CoreMlPackage {}
// SAFETY: as above: shared access is serialized by `serial`.
unsafe impl Sync for CoreMlPackage {}
// SAFETY: a state is used by one session at a time (`&mut` in predict and reset), and every call
// into Core ML with it holds its package's `serial` lock.
unsafe impl Send for CoreMlState {}

impl std::fmt::Debug for CoreMlState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoreMlState")
    }
}

impl CoreMlPackage {
    fn model(&self, function: &str) -> Result<&Retained<MLModel>, CoreMlError> {
        self.models
            .get(function)
            .ok_or_else(|| CoreMlError::Predict {
                package: self.path.clone(),
                function: function.to_string(),
                message: format!(
                    "no such function (the package has: {:?})",
                    self.models.keys().collect::<Vec<_>>()
                ),
            })
    }
}

/// An output as the model describes it: name, shape (empty when not a multi-array) and type.
type DeclaredOutput = (String, Vec<usize>, MLMultiArrayDataType);

fn declared_outputs(model: &MLModel) -> Vec<DeclaredOutput> {
    // SAFETY: reading the immutable description of a loaded model.
    unsafe {
        let description = model.modelDescription();
        let by_name = description.outputDescriptionsByName();
        let mut out = Vec::new();
        for key in by_name.allKeys().to_vec() {
            let Some(feature) = by_name.objectForKey(&key) else {
                continue;
            };
            let constraint = feature.multiArrayConstraint();
            let shape = constraint
                .as_ref()
                .map(|c| {
                    c.shape()
                        .to_vec()
                        .iter()
                        .map(|n| n.integerValue().max(0) as usize)
                        .collect()
                })
                .unwrap_or_default();
            let dtype = constraint
                .map(|c| c.dataType())
                .unwrap_or(MLMultiArrayDataType::Float16);
            out.push((key.to_string(), shape, dtype));
        }
        out
    }
}

impl Backend for CoreMlBackend {
    type Package = CoreMlPackage;
    type State = CoreMlState;
    type Buffer = CoreMlBuffer;
    type Error = CoreMlError;

    fn name(&self) -> String {
        format!("coreml-{}", self.options.compute_units.name())
    }

    fn load(&self, path: &Path) -> Result<CoreMlPackage, CoreMlError> {
        Ok(self.load_identified(path, None)?.0)
    }

    fn load_identified(
        &self,
        path: &Path,
        content_key: Option<&str>,
    ) -> Result<(CoreMlPackage, LoadReport), CoreMlError> {
        let (major, minor, found) = os_version();
        if cfg!(target_os = "macos") && (major, minor) < MIN_MACOS_STATEFUL {
            return Err(CoreMlError::OsTooOld {
                package: path.to_path_buf(),
                what: "stateful multi-function models (MLState, functionName)",
                needed: MIN_MACOS_STATEFUL,
                found,
            });
        }
        let program = anemone_mil::read_package(path).map_err(|e| CoreMlError::Load {
            package: path.to_path_buf(),
            compiled: path.to_path_buf(),
            message: format!("reading the package's functions: {e}"),
        })?;
        let (compiled, temporary, report) = self.compiled(path, content_key)?;
        let compiled_url = url(&compiled);
        let mut models = HashMap::new();
        let mut outputs = HashMap::new();
        for function in program.functions() {
            let name = function.name().to_string();
            let config = self.configuration(Some(&name));
            // SAFETY: a compiled model directory and a configuration no one else mutates.
            let model = unsafe {
                MLModel::modelWithContentsOfURL_configuration_error(&compiled_url, &config)
            }
            .map_err(|e| CoreMlError::Load {
                package: path.to_path_buf(),
                compiled: compiled.clone(),
                message: format!("function `{name}`: {}", ns_error(&e)),
            })?;
            outputs.insert(name.clone(), declared_outputs(&model));
            models.insert(name, model);
        }
        let package = CoreMlPackage {
            path: path.to_path_buf(),
            compiled,
            models,
            outputs,
            backings: Mutex::new(HashMap::new()),
            serial: Arc::new(Mutex::new(())),
            temporary,
        };
        Ok((package, report))
    }

    fn new_state(
        &self,
        package: &CoreMlPackage,
        function: &str,
    ) -> Result<CoreMlState, CoreMlError> {
        let model = package.model(function)?.clone();
        let serial = Arc::clone(&package.serial);
        let state = {
            let _serial = serial
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // SAFETY: newState on a loaded stateful model, under the package's lock.
            unsafe { model.newState() }
        };
        Ok(CoreMlState {
            state,
            model,
            serial,
        })
    }

    fn reset_state(&self, state: &mut CoreMlState) {
        // A fresh MLState is zeroed: Core ML gives no cheaper reset.
        let _serial = state
            .serial
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // SAFETY: as in new_state.
        let fresh = unsafe { state.model.newState() };
        state.state = fresh;
    }

    /// An `MLState` keeps each state in the dtype the model declares (the arrays it hands out
    /// are the declared fp16 / fp32), so an element takes that dtype's bytes (at least one).
    fn state_element_bytes(&self, dtype: DType) -> usize {
        dtype.bits().div_ceil(8)
    }

    fn predict(
        &self,
        package: &CoreMlPackage,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut CoreMlState,
    ) -> Result<HashMap<String, Tensor>, CoreMlError> {
        run(package, function, inputs, &[], &[], state)
    }

    fn new_buffer(&self, dtype: DType, shape: &[usize]) -> Result<CoreMlBuffer, CoreMlError> {
        CoreMlBuffer::new(dtype, shape)
    }

    fn write_buffer(&self, buffer: &mut CoreMlBuffer, values: &Tensor) -> Result<(), CoreMlError> {
        buffer.write(values)
    }

    fn read_buffer(&self, buffer: &CoreMlBuffer) -> Result<Tensor, CoreMlError> {
        buffer.read()
    }

    fn copy_position(
        &self,
        from: &CoreMlBuffer,
        position: usize,
        to: &mut CoreMlBuffer,
    ) -> Result<(), CoreMlError> {
        to.copy_position(from, position)
    }

    fn predict_buffers(
        &self,
        package: &CoreMlPackage,
        function: &str,
        inputs: &mut HashMap<String, Tensor>,
        buffer_inputs: &mut [(&str, &mut CoreMlBuffer)],
        buffer_outputs: &mut [(&str, &mut CoreMlBuffer)],
        state: &mut CoreMlState,
        _checked: bool,
    ) -> Result<CheckedOutputs, CoreMlError> {
        let bound_in: Vec<(&str, &CoreMlBuffer)> =
            buffer_inputs.iter().map(|(n, b)| (*n, &**b)).collect();
        let bound_out: Vec<(&str, &CoreMlBuffer)> =
            buffer_outputs.iter().map(|(n, b)| (*n, &**b)).collect();
        // Core ML cannot name the op that first went non-finite.
        Ok((
            run(package, function, inputs, &bound_in, &bound_out, state)?,
            None,
        ))
    }
}

/// One prediction: `inputs` copied into new arrays, the buffers of `bound_in` given as they are
/// (IOSurface-backed: no copy), the buffers of `bound_out` as output backings (Core ML writes
/// the outputs into them); every other declared output comes back as a tensor.
fn run(
    package: &CoreMlPackage,
    function: &str,
    inputs: &HashMap<String, Tensor>,
    bound_in: &[(&str, &CoreMlBuffer)],
    bound_out: &[(&str, &CoreMlBuffer)],
    state: &mut CoreMlState,
) -> Result<HashMap<String, Tensor>, CoreMlError> {
    let model = package.model(function)?;
    let bad_input = |input: &str, problem: String| CoreMlError::Input {
        package: package.path.clone(),
        function: function.to_string(),
        input: input.to_string(),
        problem,
    };
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for (name, tensor) in inputs {
        let array = to_multiarray(tensor).map_err(|p| bad_input(name, p))?;
        keys.push(NSString::from_str(name));
        // SAFETY: wrapping an array we own.
        values.push(unsafe { MLFeatureValue::featureValueWithMultiArray(&array) });
    }
    for (name, buffer) in bound_in {
        keys.push(NSString::from_str(name));
        // SAFETY: wrapping a buffer the session owns; it outlives the prediction.
        values.push(unsafe { MLFeatureValue::featureValueWithMultiArray(&buffer.array) });
    }
    let key_refs: Vec<&NSString> = keys.iter().map(|k| &**k).collect();
    let value_refs: Vec<&AnyObject> = values.iter().map(|v| &****v).collect();
    let dict = NSDictionary::from_slices(&key_refs, &value_refs);
    // SAFETY: a dictionary of feature values, as the initializer requires.
    let provider = unsafe {
        MLDictionaryFeatureProvider::initWithDictionary_error(
            MLDictionaryFeatureProvider::alloc(),
            &dict,
        )
    }
    .map_err(|e| bad_input("(all)", ns_error(&e)))?;
    let declared = package.outputs.get(function).cloned().unwrap_or_default();
    let shape_error =
        |output: &str, expected: &[usize], found: Vec<usize>| CoreMlError::OutputShape {
            package: package.path.clone(),
            function: function.to_string(),
            output: output.to_string(),
            expected: expected.to_vec(),
            found,
        };
    for (name, buffer) in bound_out {
        match declared.iter().find(|(output, _, _)| output == name) {
            None => {
                return Err(CoreMlError::OutputMissing {
                    package: package.path.clone(),
                    function: function.to_string(),
                    output: name.to_string(),
                })
            }
            Some((_, shape, _)) if !shape.is_empty() && shape != &buffer.shape => {
                return Err(shape_error(name, shape, buffer.shape.clone()))
            }
            Some(_) => {}
        }
    }
    let _serial = package
        .serial
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // SAFETY: fresh options, set before the prediction that uses them.
    let options = unsafe { MLPredictionOptions::new() };
    {
        let mut backings = package
            .backings
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut names = Vec::new();
        let mut arrays = Vec::new();
        for (output, shape, dtype) in &declared {
            if let Some((_, buffer)) = bound_out.iter().find(|(n, _)| n == output) {
                names.push(NSString::from_str(output));
                arrays.push(buffer.array.clone());
                continue;
            }
            if shape.is_empty() {
                continue;
            }
            let key = (function.to_string(), output.clone());
            if !backings.contains_key(&key) {
                // SAFETY: a fresh array of the declared shape and type, owned by the package.
                let array = unsafe {
                    MLMultiArray::initWithShape_dataType_error(
                        MLMultiArray::alloc(),
                        &ns_shape(shape),
                        *dtype,
                    )
                }
                .map_err(|e| CoreMlError::Predict {
                    package: package.path.clone(),
                    function: function.to_string(),
                    message: format!("output backing `{output}`: {}", ns_error(&e)),
                })?;
                backings.insert(key.clone(), array);
            }
            names.push(NSString::from_str(output));
            arrays.push(backings[&key].clone());
        }
        let name_refs: Vec<&NSString> = names.iter().map(|k| &**k).collect();
        let array_refs: Vec<&AnyObject> = arrays.iter().map(|a| &****a).collect();
        let backing_dict = NSDictionary::from_slices(&name_refs, &array_refs);
        // SAFETY: output name → MLMultiArray of the output's shape, as Core ML requires.
        unsafe { options.setOutputBackings(&backing_dict) };
    }
    // SAFETY: the model's own state; predictions on this model are serialized above.
    let result = unsafe {
        model.predictionFromFeatures_usingState_options_error(
            ProtocolObject::from_ref(&*provider),
            &state.state,
            &options,
        )
    }
    .map_err(|e| CoreMlError::Predict {
        package: package.path.clone(),
        function: function.to_string(),
        message: ns_error(&e),
    })?;
    let mut out = HashMap::new();
    for (output, shape, _) in &declared {
        // SAFETY: reading the outputs of a finished prediction.
        let value = unsafe { result.featureValueForName(&NSString::from_str(output)) };
        let array = value
            .and_then(|v| unsafe { v.multiArrayValue() })
            .ok_or_else(|| CoreMlError::OutputMissing {
                package: package.path.clone(),
                function: function.to_string(),
                output: output.clone(),
            })?;
        if let Some((_, buffer)) = bound_out.iter().find(|(n, _)| n == output) {
            if !std::ptr::eq(&*array, &*buffer.array) {
                // Core ML declined the backing (it may, e.g. for a layout it cannot write):
                // the values go into the buffer by the host, so the next chunk still reads them.
                tracing::debug!(output = %output, "output backing not used; copying");
                let (dtype, found, data) = read_multiarray(&array);
                let tensor = Tensor::new(dtype, found.clone(), data)
                    .map_err(|_| shape_error(output, &buffer.shape, found.clone()))?;
                if tensor.dtype != buffer.dtype || tensor.shape != buffer.shape {
                    return Err(shape_error(output, &buffer.shape, found));
                }
                write_array(&buffer.array, &tensor);
            }
            continue;
        }
        let (dtype, found, data) = read_multiarray(&array);
        if !shape.is_empty() && &found != shape {
            return Err(shape_error(output, shape, found));
        }
        let tensor = Tensor::new(dtype, found.clone(), data)
            .map_err(|e| shape_error(&format!("{output} ({e})"), shape, found))?;
        out.insert(output.clone(), tensor);
    }
    Ok(out)
}

/// The result of `MLComputePlan`'s completion handler, carried to the waiting thread.
struct PlanResult(Result<Retained<MLComputePlan>, String>);
// SAFETY: the plan is immutable once loaded; it is only read after the handler has run.
unsafe impl Send for PlanResult {}

/// The compute plan of every function of `package` under `options`' compute units (macOS 14.4+).
pub fn compute_plan(package: &Path, options: &CoreMlOptions) -> Result<PackagePlan, CoreMlError> {
    let (major, minor, found) = os_version();
    if (major, minor) < MIN_MACOS_PLAN {
        return Err(CoreMlError::OsTooOld {
            package: package.to_path_buf(),
            what: "MLComputePlan",
            needed: MIN_MACOS_PLAN,
            found,
        });
    }
    let backend = CoreMlBackend::new(options.clone());
    let (compiled, temporary, _) = backend.compiled(package, None)?;
    let config = backend.configuration(None);
    let (tx, rx) = mpsc::channel::<PlanResult>();
    let handler = block2::RcBlock::new(move |plan: *mut MLComputePlan, error: *mut NSError| {
        // SAFETY: Core ML hands one of the two, valid for the duration of the call.
        let result = unsafe {
            match Retained::retain(plan) {
                Some(plan) => Ok(plan),
                None => Err(Retained::retain(error)
                    .map(|e| ns_error(&e))
                    .unwrap_or_else(|| "no plan and no error".into())),
            }
        };
        let _ = tx.send(PlanResult(result));
    });
    // SAFETY: a compiled model URL, a configuration and a handler that outlives the call.
    unsafe {
        MLComputePlan::loadContentsOfURL_configuration_completionHandler(
            &url(&compiled),
            &config,
            &handler,
        )
    };
    let plan_err = |message: String| CoreMlError::Plan {
        package: package.to_path_buf(),
        message,
    };
    let plan = rx
        .recv()
        .map_err(|_| plan_err("Core ML dropped the completion handler".into()))?
        .0
        .map_err(plan_err)?;
    let mut ops = Vec::new();
    // SAFETY: reading the immutable structure of a loaded plan.
    unsafe {
        let program = plan
            .modelStructure()
            .program()
            .ok_or_else(|| plan_err("the model is not an ML program".into()))?;
        let functions = program.functions();
        for name in functions.allKeys().to_vec() {
            let Some(function) = functions.objectForKey(&name) else {
                continue;
            };
            for op in function.block().operations().to_vec() {
                let usage = plan.computeDeviceUsageForMLProgramOperation(&op);
                let preferred = usage.as_ref().map(|u| device(&u.preferredComputeDevice()));
                let supported = usage
                    .as_ref()
                    .map(|u| {
                        u.supportedComputeDevices()
                            .to_vec()
                            .iter()
                            .map(|d| device(d))
                            .collect()
                    })
                    .unwrap_or_default();
                let cost = plan
                    .estimatedCostOfMLProgramOperation(&op)
                    .map(|c| c.weight());
                ops.push(OpPlan {
                    function: name.to_string(),
                    op_type: op.operatorName().to_string(),
                    preferred,
                    supported,
                    cost,
                });
            }
        }
    }
    if let Some(dir) = temporary {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(PackagePlan {
        package: package.to_path_buf(),
        ops,
    })
}

fn device(d: &ProtocolObject<dyn objc2_core_ml::MLComputeDeviceProtocol>) -> Device {
    let object: &AnyObject = d.as_ref();
    let class = object.class().name().to_string_lossy().into_owned();
    if class.contains("NeuralEngine") {
        Device::NeuralEngine
    } else if class.contains("GPU") {
        Device::Gpu
    } else {
        Device::Cpu
    }
}
