//! The executor as an implementation of the backend contract ([`anemone_backend::Backend`]).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anemone_backend::{Backend, CheckedOutputs, Tensor, TensorError};
use anemone_mil::{DType, Precision};

use crate::error::ExecError;
use crate::kernels::Accumulation;
use crate::package::{LoadedPackage, State};
use crate::team::{self, Team};

/// The MIL executor in fp32 or fp16-faithful arithmetic, on the global rayon pool or its own.
#[derive(Clone)]
pub struct ExecutorBackend {
    pub precision: Precision,
    pub accumulation: Accumulation,
    pool: Option<Arc<rayon::ThreadPool>>,
    /// The helpers of the single-token matvecs, as many threads as `pool` (shared with every
    /// user of [`Team::shared`] of that width, e.g. the host's LM head).
    team: Option<Arc<Team>>,
    /// Whether a multi-token predict ran on `pool` since its scratch was last released (shared
    /// by the clones, which share the pool).
    scratch_held: Arc<AtomicBool>,
}

impl std::fmt::Debug for ExecutorBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorBackend")
            .field("precision", &self.precision)
            .field("accumulation", &self.accumulation)
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
            accumulation: Accumulation::F32,
            pool: None,
            team: None,
            scratch_held: Arc::default(),
        }
    }

    /// The same backend with sums inside ops accumulating as `accumulation` says.
    pub fn with_accumulation(mut self, accumulation: Accumulation) -> Self {
        self.accumulation = accumulation;
        self
    }

    /// Runs every predict on a pool of `threads` threads, its matvecs on the process's team of
    /// `threads` threads ([`Team::shared`]; on the caller alone if no helper could start).
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
            accumulation: Accumulation::F32,
            pool: Some(Arc::new(pool)),
            team: Team::shared(threads).ok(),
            scratch_held: Arc::default(),
        })
    }
}

impl ExecutorBackend {
    /// Runs `run` (a predict of `function`) with this backend's threads: a function that never
    /// forks onto a pool (a single-token step, [`LoadedPackage::runs_without_pool`]) runs on
    /// the calling thread with the team, so a decode step costs no hand-over to a pool worker
    /// and leaves no idle worker spinning; any other runs inside the pool. The values are the
    /// same either way.
    ///
    /// The scratch of wide products is kept from one multi-token predict to the next (a
    /// prefill's chunks reuse it, and the heap pages their activations freed) and released
    /// before the first single-token step that follows, which never uses it.
    fn on_threads<R: Send>(
        &self,
        package: &LoadedPackage,
        function: &str,
        run: impl FnOnce() -> Result<R, ExecError> + Send,
    ) -> Result<R, ExecError> {
        let Some(pool) = &self.pool else {
            return run();
        };
        match &self.team {
            Some(team) if package.runs_without_pool(function)? => {
                if self.scratch_held.swap(false, Ordering::Relaxed) {
                    release_scratch(pool);
                }
                team::with_team(team, run)
            }
            Some(team) => {
                self.scratch_held.store(true, Ordering::Relaxed);
                pool.install(|| team::with_team(team, run))
            }
            None => {
                self.scratch_held.store(true, Ordering::Relaxed);
                pool.install(run)
            }
        }
    }
}

/// Frees the scratch buffers of wide products on every thread of `pool` (where multi-token
/// steps ran them) and returns the freed memory to the system: the decode steps that follow
/// never use them, and they would stay resident for the rest of the run.
fn release_scratch(pool: &rayon::ThreadPool) {
    pool.broadcast(|_| crate::kernels::release_scratch());
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own free lists, under its arena locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Backend for ExecutorBackend {
    type Package = LoadedPackage;
    type State = State;
    /// A host tensor: buffers move in and out of a prediction without a copy.
    type Buffer = Tensor;
    type Error = ExecError;

    fn name(&self) -> String {
        match self.accumulation {
            Accumulation::F32 => format!("executor-{}", self.precision.name()),
            Accumulation::Fp16Blocks => format!("executor-{}-acc", self.precision.name()),
        }
    }

    fn load(&self, path: &Path) -> Result<Self::Package, Self::Error> {
        Ok(LoadedPackage::load(path, self.precision)?.with_accumulation(self.accumulation))
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

    /// An fp16 program holds its fp16 states as fp16 ([`State`]); everything else is f32.
    fn state_element_bytes(&self, dtype: DType) -> usize {
        if dtype == DType::F16 && self.precision == Precision::Fp16 {
            2
        } else {
            4
        }
    }

    fn predict(
        &self,
        package: &Self::Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut Self::State,
    ) -> Result<HashMap<String, Tensor>, Self::Error> {
        let run = || package.predict(function, inputs, state);
        self.on_threads(package, function, run)
    }

    fn predict_checked(
        &self,
        package: &Self::Package,
        function: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut Self::State,
    ) -> Result<CheckedOutputs, Self::Error> {
        let mut first_non_finite = None;
        let run = || {
            package.predict_observed(function, inputs, state, &mut |o| {
                if first_non_finite.is_none() && o.tensor.data.iter().any(|v| !v.is_finite()) {
                    first_non_finite = Some(format!("{} ({})", o.op, o.op_type));
                }
            })
        };
        let outputs = self.on_threads(package, function, run)?;
        Ok((outputs, first_non_finite))
    }

    fn new_buffer(&self, dtype: DType, shape: &[usize]) -> Result<Tensor, ExecError> {
        Ok(Tensor::new(
            dtype,
            shape,
            vec![0.0; shape.iter().product()],
        )?)
    }

    fn write_buffer(&self, buffer: &mut Tensor, values: &Tensor) -> Result<(), ExecError> {
        if buffer.dtype != values.dtype || buffer.shape != values.shape {
            return Err(TensorError {
                detail: format!("writing {values} into a buffer of {buffer}"),
            }
            .into());
        }
        buffer.data.copy_from_slice(&values.data);
        Ok(())
    }

    fn read_buffer(&self, buffer: &Tensor) -> Result<Tensor, ExecError> {
        Ok(buffer.clone())
    }

    fn copy_position(
        &self,
        from: &Tensor,
        position: usize,
        to: &mut Tensor,
    ) -> Result<(), ExecError> {
        let (rows, t) = match from.shape.split_last() {
            Some((&t, rest)) => (rest.iter().product::<usize>(), t),
            None => (0, 0),
        };
        let fits = from.dtype == to.dtype
            && position < t
            && to.shape.split_last() == Some((&1, &from.shape[..from.shape.len() - 1]));
        if !fits {
            return Err(TensorError {
                detail: format!("copying position {position} of a buffer of {from} into {to}"),
            }
            .into());
        }
        for (r, v) in to.data.iter_mut().enumerate().take(rows) {
            *v = from.data[r * t + position];
        }
        Ok(())
    }

    fn predict_buffers(
        &self,
        package: &LoadedPackage,
        function: &str,
        inputs: &mut HashMap<String, Tensor>,
        buffer_inputs: &mut [(&str, &mut Tensor)],
        buffer_outputs: &mut [(&str, &mut Tensor)],
        state: &mut State,
        checked: bool,
    ) -> Result<CheckedOutputs, ExecError> {
        // The buffers' tensors move into the inputs and back out: no copy.
        for (name, buffer) in buffer_inputs.iter_mut() {
            let placeholder = Tensor::zeros(buffer.dtype, [0]);
            inputs.insert(
                name.to_string(),
                std::mem::replace(&mut **buffer, placeholder),
            );
        }
        let result = if checked {
            self.predict_checked(package, function, inputs, state)
        } else {
            self.predict(package, function, inputs, state)
                .map(|outputs| (outputs, None))
        };
        for (name, buffer) in buffer_inputs.iter_mut() {
            if let Some(tensor) = inputs.remove(*name) {
                **buffer = tensor;
            }
        }
        let (mut outputs, first_non_finite) = result?;
        for (name, buffer) in buffer_outputs.iter_mut() {
            let tensor = outputs.remove(*name).ok_or_else(|| TensorError {
                detail: format!(
                    "package {}: function `{function}`: no output `{name}` for its buffer",
                    package.path().display()
                ),
            })?;
            if tensor.dtype != buffer.dtype || tensor.shape != buffer.shape {
                return Err(TensorError {
                    detail: format!(
                        "package {}: function `{function}`: output `{name}` is {tensor}, its \
                         buffer {buffer}",
                        package.path().display()
                    ),
                }
                .into());
            }
            **buffer = tensor;
        }
        Ok((outputs, first_non_finite))
    }
}

/// The executor arithmetics `--precision` names: a [`Precision`] and how sums inside ops
/// accumulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arithmetic {
    /// fp16 values (every fp16 op output rounded to fp16), sums in f32: the contract.
    Fp16,
    /// fp32 values, sums in f32 (no rounding).
    Fp32,
    /// fp16 values with sums accumulated in fp16 blocks: the pessimistic bracket.
    Fp16Acc,
}

impl Arithmetic {
    pub const ALL: [Arithmetic; 3] = [Arithmetic::Fp16, Arithmetic::Fp32, Arithmetic::Fp16Acc];

    pub fn name(self) -> &'static str {
        match self {
            Arithmetic::Fp16 => "fp16",
            Arithmetic::Fp32 => "fp32",
            Arithmetic::Fp16Acc => "fp16-acc",
        }
    }

    pub fn precision(self) -> Precision {
        match self {
            Arithmetic::Fp16 | Arithmetic::Fp16Acc => Precision::Fp16,
            Arithmetic::Fp32 => Precision::Fp32,
        }
    }

    pub fn accumulation(self) -> Accumulation {
        match self {
            Arithmetic::Fp16 | Arithmetic::Fp32 => Accumulation::F32,
            Arithmetic::Fp16Acc => Accumulation::Fp16Blocks,
        }
    }
}

impl From<Precision> for Arithmetic {
    fn from(p: Precision) -> Self {
        match p {
            Precision::Fp16 => Arithmetic::Fp16,
            Precision::Fp32 => Arithmetic::Fp32,
        }
    }
}

impl std::fmt::Display for Arithmetic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Arithmetic {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Arithmetic::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                let known: Vec<&str> = Arithmetic::ALL.iter().map(|a| a.name()).collect();
                format!("unknown precision `{s}` (one of: {})", known.join(", "))
            })
    }
}
