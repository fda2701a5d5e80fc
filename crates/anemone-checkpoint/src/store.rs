//! Lazily loaded named tensors. Stores keep files memory-mapped and convert one tensor at a time,
//! so a converter can stream a model through without holding it twice.

use crate::error::{CheckpointError, Result};
use std::collections::BTreeMap;

/// Shape and on-disk type of one tensor (shape in Hugging Face order, outermost first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub shape: Vec<usize>,
    /// On-disk type as its format names it (`F32`, `BF16`, `Q4_K`, …), for reports.
    pub dtype: String,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

pub trait TensorStore: Send + Sync {
    /// All tensor names, sorted.
    fn names(&self) -> Vec<String>;
    fn info(&self, name: &str) -> Option<TensorInfo>;
    /// The tensor as row-major f32 in its Hugging Face shape.
    fn load_f32(&self, name: &str) -> Result<Vec<f32>>;
    /// [`TensorStore::load_f32`] written into `out` (exactly the tensor's element count), the
    /// same values: a store that can convert in place overrides it so a caller that owns the
    /// destination (the reference's weight arena) holds no second copy. The default loads, then
    /// copies.
    fn load_f32_into(&self, name: &str, out: &mut [f32]) -> Result<()> {
        let values = self.load_f32(name)?;
        check_len(name, values.len(), out)?;
        out.copy_from_slice(&values);
        Ok(())
    }
    /// Linear modules the checkpoint stores fused and this store presents split (Phi-3's
    /// `qkv_proj` as `q_proj`, `k_proj`, `v_proj`): what a LoRA adapter of the fused module
    /// merges into. None for most stores.
    fn fused_modules(&self) -> Vec<FusedModule> {
        Vec::new()
    }
}

/// An error unless `out` holds exactly `numel` values (the tensor `name` has `numel` elements).
pub fn check_len(name: &str, numel: usize, out: &[f32]) -> Result<()> {
    if out.len() == numel {
        Ok(())
    } else {
        Err(CheckpointError::ShapeMismatch {
            name: name.into(),
            expected: vec![out.len()],
            found: vec![numel],
        })
    }
}

/// A fused linear module (`<prefix>.qkv_proj`) and the modules it is presented as, each with
/// the rows of the fused weight it holds (in order, covering them all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FusedModule {
    pub module: String,
    /// `[rows, in]` of the fused weight.
    pub shape: Vec<usize>,
    pub parts: Vec<(String, std::ops::Range<usize>)>,
}

/// Tensors held in memory: for tests, LoRA-merged weights and synthetic checkpoints.
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts a tensor. Panics if `data.len()` disagrees with `shape` (a programming error).
    pub fn insert(&mut self, name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "tensor data length disagrees with its shape"
        );
        self.tensors.insert(name.into(), (shape, data));
    }
}

impl TensorStore for MemoryStore {
    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.tensors.get(name).map(|(shape, _)| TensorInfo {
            shape: shape.clone(),
            dtype: "F32".into(),
        })
    }

    fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.tensors
            .get(name)
            .map(|(_, data)| data.clone())
            .ok_or_else(|| CheckpointError::MissingTensor { name: name.into() })
    }
}
