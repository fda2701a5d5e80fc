//! Loading a package: constants decoded once to f32 compute buffers (shared between functions
//! with identical payloads), non-constant ops scheduled with buffer lifetimes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anemone_backend::Tensor;
use anemone_mil::{DType, Function, Op, Precision, TensorData, TensorType, Var};
use half::f16;

use crate::decompress::{blockwise_shift_scale, const_tensor, lut_to_dense};
use crate::error::{ExecError, Result};
use crate::f32_weight::F32Weight;
use crate::packed::HalfWeight;
pub use crate::state::State;

/// One named value of a function signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    pub name: String,
    pub ty: TensorType,
}

/// A function's tensor inputs, states and outputs, in declaration order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    pub inputs: Vec<Port>,
    pub states: Vec<Port>,
    pub outputs: Vec<Port>,
}

/// A non-constant op ready to run.
pub(crate) struct Step {
    pub name: String,
    /// The op (never a const/constexpr: those are decoded at load time).
    pub op: Op,
    pub outputs: Vec<Var>,
    pub out_types: Vec<TensorType>,
    /// Values dead after this step.
    pub release: Vec<Var>,
    /// Operands used once here for the last time: their buffers may be taken over.
    pub movable: Vec<Var>,
    pub fused: Fused,
}

/// How a step takes part in the `read_state → slice_update → write_state` pattern of a KV
/// cache write, which runs as one in-place update of the state (no copy of the cache).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fused {
    /// Runs as itself.
    No,
    /// The write_state closing a fused chain: nothing to do.
    Elided,
    /// The read_state opening a fused chain: its value is the named state itself, read in
    /// place (no copy).
    ReadsInPlace(String),
    /// A slice_update applied directly to the named state (checked before anything changes);
    /// its value is the state itself.
    UpdatesState(String),
    /// A contiguous slice_by_index of a fused chain value read only by matmuls: its value is
    /// the window of the named state's data at `offset` (no copy), read by those matmuls
    /// before the chain's next update.
    View { state: String, offset: usize },
}

pub(crate) struct PreparedFunction {
    pub name: String,
    pub signature: Signature,
    pub input_vars: Vec<Var>,
    pub state_vars: Vec<Var>,
    pub output_vars: Vec<Var>,
    pub value_names: Vec<String>,
    /// Constants held as f32 (every constant except the fp16 projection weights below).
    pub constants: Vec<(Var, Arc<Tensor>)>,
    /// fp16 projection weights (1×1 conv, linear), kept fp16 (the package's own bytes) or as
    /// their fp16 constexpr's compressed payload ([`crate::packed`]) and only so: single-token
    /// steps read them directly ([`crate::kernels::linalg::matvec_f16`], the fused kernels of
    /// [`crate::kernels::quant`]), wider steps expand them exactly into a reused f32 buffer.
    /// Either way the sums equal those over the expanded f32 values.
    pub half_weights: HashMap<Var, Arc<HalfWeight>>,
    /// f32 projection weights read in place from the package's bytes ([`crate::f32_weight`]):
    /// not decoded into `constants`; steps read them as they would read those.
    pub f32_weights: HashMap<Var, Arc<F32Weight>>,
    pub steps: Vec<Step>,
    /// Whether `steps[i..]` opens one head's six attention ops (`interp::attend::matches`).
    pub head_starts: Vec<bool>,
    /// The op chain `steps[i..]` opens with, run as one step (`interp::chains::matches`).
    pub chain_starts: Vec<Option<crate::interp::chains::Chain>>,
    /// Whether the steps never enter rayon under f32 accumulation
    /// ([`crate::plan::runs_without_pool`]).
    pub without_pool: bool,
    /// After projection step `i`, the next projection's weight bytes, for the team to warm
    /// ([`crate::plan::warm_after`]).
    pub warm_after: Vec<Option<crate::plan::WarmNext>>,
}

impl PreparedFunction {
    /// Asks for the cache lines of the steps' own bookkeeping (each step, its output, type,
    /// release and move lists, each output's shape, the per-step plans) before the steps run.
    /// A decoder's layers are packages of their own: by the next token every layer's program
    /// has left the caches, and the interpreter would meet those lines one dependent miss at a
    /// time (≈ 17 µs a SmolLM2 layer). Hints only: nothing is read or changed.
    pub(crate) fn prefetch_program(&self) {
        for (i, step) in self.steps.iter().enumerate() {
            prefetch(step);
            prefetch(step.outputs.as_ptr());
            prefetch(step.out_types.as_ptr());
            prefetch(step.release.as_ptr());
            prefetch(step.movable.as_ptr());
            if let (Some(chain), Some(warm)) = (self.chain_starts.get(i), self.warm_after.get(i)) {
                prefetch(chain);
                prefetch(warm);
            }
        }
        // one level down, once the lines above have been asked for
        for ty in self.steps.iter().filter_map(|s| s.out_types.first()) {
            prefetch(ty.shape.as_ptr());
        }
    }
}

/// Asks for the cache line holding `at` (a hint: never dereferenced, never faults).
fn prefetch<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never dereferences its address and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// A package loaded from disk and prepared for execution in one precision.
pub struct LoadedPackage {
    pub(crate) path: PathBuf,
    pub(crate) precision: Precision,
    pub(crate) accumulation: crate::kernels::Accumulation,
    pub(crate) functions: Vec<PreparedFunction>,
    pub(crate) default_function: String,
}

/// Cache key of a decoded constant: identical payloads decode once per package.
#[derive(PartialEq, Eq, Hash)]
enum ConstKey {
    Plain(Payload),
    ShiftScale(Payload, Payload, Option<Payload>),
    Lut(Payload, Payload),
}

/// A constant's payload as a cache key: small payloads by value, large ones (weights) by
/// identity — the reader shares one buffer between all uses of a blob record (every function
/// of a package), and hashing or comparing megabytes of weights per use made a load slower.
struct Payload(TensorData);

/// Payloads up to this many bytes are keyed by value.
const BY_VALUE: usize = 4096;

impl Payload {
    fn by_value(&self) -> bool {
        self.0.bytes().len() <= BY_VALUE
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Self) -> bool {
        if self.by_value() || other.by_value() {
            return self.0 == other.0;
        }
        self.0.tensor_type() == other.0.tensor_type()
            && self.0.shared_bytes().same_storage(other.0.shared_bytes())
    }
}

impl Eq for Payload {}

impl std::hash::Hash for Payload {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if self.by_value() {
            self.0.hash(state);
        } else {
            self.0.tensor_type().hash(state);
            self.0.shared_bytes().addr().hash(state);
        }
    }
}

/// Constants decoded so far while loading a package (shared between its functions).
#[derive(Default)]
struct Caches {
    consts: HashMap<ConstKey, Arc<Tensor>>,
    /// fp16 copies of decoded f32 constants, by constant.
    halves: HashMap<*const Tensor, Arc<HalfWeight>>,
    /// Projection weights held as stored (never decoded to f32).
    packed: HashMap<ConstKey, Option<Arc<HalfWeight>>>,
}

impl LoadedPackage {
    /// Reads `path` (an `.mlpackage`) and prepares every function for `precision`.
    pub fn load(path: &Path, precision: Precision) -> Result<Self> {
        let program = anemone_mil::read_package(path).map_err(|source| ExecError::Load {
            path: path.to_path_buf(),
            source,
        })?;
        let mut caches = Caches::default();
        let functions = program
            .functions()
            .iter()
            .map(|f| prepare(path, f, &mut caches))
            .collect::<Result<Vec<_>>>()?;
        let default_function = program.default_function_name().to_string();
        drop(caches);
        drop(program);
        release_freed_memory();
        Ok(LoadedPackage {
            path: path.to_path_buf(),
            precision,
            accumulation: crate::kernels::Accumulation::F32,
            functions,
            default_function,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Sums inside ops accumulate as `accumulation` says (f32 unless set).
    pub fn with_accumulation(mut self, accumulation: crate::kernels::Accumulation) -> Self {
        self.accumulation = accumulation;
        self
    }

    pub fn accumulation(&self) -> crate::kernels::Accumulation {
        self.accumulation
    }

    pub fn function_names(&self) -> impl Iterator<Item = &str> {
        self.functions.iter().map(|f| f.name.as_str())
    }

    pub fn default_function(&self) -> &str {
        &self.default_function
    }

    pub(crate) fn function(&self, name: &str) -> Result<&PreparedFunction> {
        self.functions
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| ExecError::UnknownFunction {
                path: self.path.clone(),
                function: name.to_string(),
                available: self.function_names().collect::<Vec<_>>().join(", "),
            })
    }

    /// Whether `function` runs without forking onto a thread pool (its parallel regions, if
    /// any, run on the decode [`crate::team`]): true of single-token steps with f32
    /// accumulation. Such a function is best run on the calling thread.
    pub fn runs_without_pool(&self, function: &str) -> Result<bool> {
        Ok(self.accumulation == crate::kernels::Accumulation::F32
            && self.function(function)?.without_pool)
    }

    /// The inputs, states and outputs of `function`.
    pub fn signature(&self, function: &str) -> Result<&Signature> {
        Ok(&self.function(function)?.signature)
    }

    /// The slice_update ops of `function` that write a state in place (the
    /// `read_state → slice_update… → write_state` chains run without copying the state; if a
    /// later write of a chain fails, the earlier ones have been applied).
    pub fn in_place_state_updates(&self, function: &str) -> Result<Vec<&str>> {
        Ok(self
            .function(function)?
            .steps
            .iter()
            .filter(|s| matches!(s.fused, Fused::UpdatesState(_)))
            .map(|s| s.name.as_str())
            .collect())
    }

    /// The first op of every op chain of `function` that runs as one step when its operands
    /// have the shapes the fused kernel takes (the max-scaled RMSNorm and RoPE chains of a
    /// decoder layer, [`crate::kernels::chains`]); an observed run runs them op by op.
    pub fn fused_chains(&self, function: &str) -> Result<Vec<&str>> {
        let f = self.function(function)?;
        Ok(f.steps
            .iter()
            .zip(&f.chain_starts)
            .filter(|(_, chain)| chain.is_some())
            .map(|(s, _)| s.name.as_str())
            .collect())
    }

    /// Every projection of `function` whose region is followed by the team's idle helpers
    /// asking the memory for the weights of the next projection of another input, with that
    /// projection (`plan::warm_after`).
    pub fn warmed_projections(&self, function: &str) -> Result<Vec<(&str, &str)>> {
        let f = self.function(function)?;
        Ok(f.steps
            .iter()
            .zip(&f.warm_after)
            .filter_map(|(s, next)| {
                Some((s.name.as_str(), f.steps[next.as_ref()?.step].name.as_str()))
            })
            .collect())
    }

    /// Zero-filled states for every state `function` declares (their declared types and
    /// shapes; an fp16 program holds its fp16 states as fp16, see [`State`]).
    pub fn new_state(&self, function: &str) -> Result<State> {
        let f = self.function(function)?;
        let ports = f
            .signature
            .states
            .iter()
            .map(|p| (p.name.as_str(), p.ty.dtype, p.ty.shape.as_slice()));
        Ok(State::zeros(ports, self.precision == Precision::Fp16))
    }
}

/// Hands the pages a load freed (the package file read whole, payload copies the program held)
/// back to the OS: glibc keeps freed heap memory mapped, and a bundle of many packages loaded
/// one after the other otherwise keeps tens of MiB of it resident while generating.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: glibc's malloc_trim only returns free heap pages to the OS (madvise); it is
        // thread-safe and callable at any time.
        unsafe {
            malloc_trim(0);
        }
    }
}

fn const_key(op: &Op) -> Option<ConstKey> {
    let p = |t: &TensorData| Payload(t.clone());
    Some(match op {
        Op::Const { value } => ConstKey::Plain(p(value)),
        Op::ConstexprBlockwiseShiftScale {
            data,
            scale,
            offset,
        } => ConstKey::ShiftScale(p(data), p(scale), offset.as_ref().map(p)),
        Op::ConstexprLutToDense { indices, lut } => ConstKey::Lut(p(indices), p(lut)),
        _ => return None,
    })
}

/// A projection weight kept as stored (fp16 values or an fp16 constexpr's compressed payload),
/// or `None` when the constant is not one.
fn packed_weight(
    op: &Op,
    cache: &mut HashMap<ConstKey, Option<Arc<HalfWeight>>>,
) -> Option<Arc<HalfWeight>> {
    let key = const_key(op)?;
    cache
        .entry(key)
        .or_insert_with_key(|key| {
            match key {
                ConstKey::Plain(v) => HalfWeight::half(&v.0),
                ConstKey::ShiftScale(d, s, o) => {
                    HalfWeight::shift_scale(&d.0, &s.0, o.as_ref().map(|o| &o.0))
                }
                ConstKey::Lut(i, l) => HalfWeight::lut(&i.0, &l.0),
            }
            .map(Arc::new)
        })
        .clone()
}

fn decode_constant(
    op: &Op,
    cache: &mut HashMap<ConstKey, Arc<Tensor>>,
) -> Result<Arc<Tensor>, String> {
    let Some(key) = const_key(op) else {
        return Err(format!("`{}` is not a constant op", op.mil_type()));
    };
    if let Some(t) = cache.get(&key) {
        return Ok(t.clone());
    }
    let t = Arc::new(match &key {
        ConstKey::Plain(v) => const_tensor(&v.0)?,
        ConstKey::ShiftScale(d, s, o) => {
            blockwise_shift_scale(&d.0, &s.0, o.as_ref().map(|o| &o.0))?
        }
        ConstKey::Lut(i, l) => lut_to_dense(&i.0, &l.0)?,
    });
    cache.insert(key, t.clone());
    Ok(t)
}

fn ports(f: &Function, vars: &[Var]) -> Vec<Port> {
    vars.iter()
        .map(|&v| Port {
            name: f.value_name(v).to_string(),
            ty: f.tensor_type(v).clone(),
        })
        .collect()
}

fn prepare(path: &Path, f: &Function, caches: &mut Caches) -> Result<PreparedFunction> {
    let mut constants = Vec::new();
    let mut steps = Vec::new();
    let mut const_ops = Vec::new();
    for operation in f.operations() {
        if operation.op.is_constant() {
            const_ops.push(operation);
            continue;
        }
        steps.push(Step {
            name: operation.name.clone(),
            op: operation.op.clone(),
            outputs: operation.outputs.clone(),
            out_types: operation
                .outputs
                .iter()
                .map(|&v| f.tensor_type(v).clone())
                .collect(),
            release: Vec::new(),
            movable: Vec::new(),
            fused: Fused::No,
        });
    }
    let projection_only = projection_only(f, &steps);
    let mut half_weights = HashMap::new();
    let mut f32_weights = HashMap::new();
    for operation in const_ops {
        if let [v] = operation.outputs[..] {
            if projection_only[v.index()] {
                if let Op::Const { value } = &operation.op {
                    if let Some(w) = F32Weight::of(value) {
                        f32_weights.insert(v, Arc::new(w));
                        continue;
                    }
                }
                if let Some(h) = packed_weight(&operation.op, &mut caches.packed) {
                    half_weights.insert(v, h);
                    continue;
                }
            }
        }
        {
            let t = decode_constant(&operation.op, &mut caches.consts).map_err(|detail| {
                ExecError::Prepare {
                    path: path.to_path_buf(),
                    function: f.name().to_string(),
                    op: operation.name.clone(),
                    op_type: operation.op.mil_type(),
                    detail,
                }
            })?;
            for &v in &operation.outputs {
                constants.push((v, t.clone()));
            }
        }
    }
    // held for the package's life: no growth slack
    steps.shrink_to_fit();
    crate::plan::plan_lifetimes(f, &mut steps);
    crate::plan::fuse_state_updates(f, &mut steps);
    half_weights.extend(self_half_weights(
        &projection_only,
        &mut constants,
        &mut caches.halves,
    ));
    let input_vars: Vec<Var> = f.tensor_inputs().collect();
    let state_vars: Vec<Var> = f.state_inputs().collect();
    let output_vars = f.outputs().to_vec();
    let without_pool =
        crate::plan::runs_without_pool(f, &steps, &|v| half_weights.contains_key(&v));
    let head_starts = (0..steps.len())
        .map(|i| crate::interp::attend::matches(&steps[i..]))
        .collect();
    let chain_starts = (0..steps.len())
        .map(|i| crate::interp::chains::matches(&steps[i..]))
        .collect();
    // plain fp16 and f32 weights: the fused kernels of compressed ones gained nothing from it
    let warm_after = crate::plan::warm_after(&steps, &|v| {
        let (start, len) = match (f32_weights.get(&v), half_weights.get(&v)) {
            (Some(w), _) => (w.values().as_ptr() as usize, 4 * w.values().len()),
            (None, Some(w)) => {
                let values = w.as_f16()?;
                (values.as_ptr() as usize, 2 * values.len())
            }
            (None, None) => return None,
        };
        Some(crate::plan::WeightBytes { start, len })
    });
    Ok(PreparedFunction {
        name: f.name().to_string(),
        signature: Signature {
            inputs: ports(f, &input_vars),
            states: ports(f, &state_vars),
            outputs: ports(f, &output_vars),
        },
        input_vars,
        state_vars,
        output_vars,
        value_names: f.values().iter().map(|v| v.name.clone()).collect(),
        constants,
        half_weights,
        f32_weights,
        steps,
        head_starts,
        chain_starts,
        without_pool,
        warm_after,
    })
}

/// For every value of `f`: whether only 1×1 convs (one group) and linears read it (as their
/// weight).
fn projection_only(f: &Function, steps: &[Step]) -> Vec<bool> {
    let mut projection_uses = vec![0usize; f.values().len()];
    let mut all_uses = vec![0usize; f.values().len()];
    for s in steps {
        for v in s.op.operands() {
            all_uses[v.index()] += 1;
        }
        match &s.op {
            Op::Conv { weight, params, .. } if params.groups == 1 => {
                projection_uses[weight.index()] += 1
            }
            Op::Linear { weight, .. } => projection_uses[weight.index()] += 1,
            _ => {}
        }
    }
    for v in f.outputs() {
        all_uses[v.index()] += 1;
    }
    projection_uses
        .iter()
        .zip(&all_uses)
        .map(|(&p, &a)| p > 0 && p == a)
        .collect()
}

/// Gives the decoded fp16 constants that only projections read (fp16 constexprs of float data)
/// an fp16 copy (shared between functions through `halves`) and drops their f32 constant when
/// the copy holds exactly its values.
fn self_half_weights(
    projection_only: &[bool],
    constants: &mut Vec<(Var, Arc<Tensor>)>,
    halves: &mut HashMap<*const Tensor, Arc<HalfWeight>>,
) -> HashMap<Var, Arc<HalfWeight>> {
    let mut out = HashMap::new();
    constants.retain(|(v, t)| {
        let pointwise =
            t.shape.len() == 2 || (t.shape.len() > 2 && t.shape[2..].iter().all(|&d| d == 1));
        if !(t.dtype == DType::F16 && pointwise && projection_only[v.index()]) {
            return true;
        }
        let h = halves.entry(Arc::as_ptr(t)).or_insert_with(|| {
            Arc::new(HalfWeight {
                shape: t.shape.clone(),
                data: crate::packed::WeightData::Half(crate::packed::Halves::Owned(
                    t.data.iter().map(|&x| f16::from_f32(x)).collect(),
                )),
            })
        });
        out.insert(*v, h.clone());
        // a dequantized weight declared fp16 may hold values fp16 cannot: wide steps keep
        // reading those f32 values (single-token steps read the fp16 copy, as always)
        !t.data.iter().all(|&x| f16::from_f32(x).to_f32() == x)
    });
    out
}
