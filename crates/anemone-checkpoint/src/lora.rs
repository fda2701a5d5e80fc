//! LoRA adapters in PEFT's layout (`adapter_config.json` + `adapter_model.safetensors`), merged
//! into a checkpoint's weights in fp32 when a tensor is loaded — before any compression, and the
//! same for Hugging Face and GGUF bases (both present their tensors under Hugging Face names).
//!
//! The merge is PEFT's `merge_and_unload` for `nn.Linear` targets:
//! `W ← W + (B·A)·s` with `s = lora_alpha / r` (`lora_alpha / √r` with `use_rslora`).
//! Everything in `adapter_config.json` that would change that math and is not implemented
//! (DoRA, LoRA biases, per-module rank/alpha patterns, layer selection, modules saved whole, …)
//! is refused by name; so is an adapter whose tensors do not fit the base (a module the base does
//! not have, a layer beyond its depth, a rank or size that disagrees).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{CheckpointError, Result};
use crate::hf::{JsonFields, SafetensorsStore};
use crate::store::{TensorInfo, TensorStore};
use crate::{hash_file, Checkpoint};

pub const ADAPTER_CONFIG: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

/// What a merged adapter was, as a bundle manifest records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraRecord {
    /// The adapter directory as given.
    pub dir: PathBuf,
    /// sha256 of `adapter_model.safetensors`.
    pub adapter_sha256: String,
    /// sha256 of `adapter_config.json`.
    pub config_sha256: String,
    pub rank: usize,
    pub lora_alpha: f64,
    pub use_rslora: bool,
    /// The factor `B·A` is multiplied by.
    pub scale: f64,
    /// `target_modules` as the config states it (a list, or one regular expression).
    pub target_modules: Vec<String>,
    /// Base tensors the adapter changed (Hugging Face names), sorted.
    pub merged_tensors: Vec<String>,
}

/// How `target_modules` selects modules (PEFT's rules).
#[derive(Debug, Clone)]
enum Targets {
    /// A module matches a name when its path equals it or ends with `.name`.
    Names(Vec<String>),
    /// `re.fullmatch(pattern, module path)`.
    Regex(String, fancy_regex::Regex),
    /// Every linear module but the output layer.
    AllLinear,
}

impl Targets {
    fn matches(&self, module: &str) -> bool {
        match self {
            Targets::Names(names) => names.iter().any(|n| name_matches(n, module)),
            Targets::Regex(_, re) => re.is_match(module).unwrap_or(false),
            Targets::AllLinear => module != "lm_head",
        }
    }

    fn describe(&self) -> Vec<String> {
        match self {
            Targets::Names(n) => n.clone(),
            Targets::Regex(p, _) => vec![p.clone()],
            Targets::AllLinear => vec!["all-linear".into()],
        }
    }
}

fn name_matches(name: &str, module: &str) -> bool {
    module == name
        || module
            .strip_suffix(name)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// `adapter_config.json` keys that change the merged weights; each is refused unless it holds
/// its neutral value (`None`: only null / absent / false / empty is neutral).
const REFUSED_KEYS: &[(&str, Option<&str>)] = &[
    ("use_dora", None),
    ("lora_bias", None),
    ("bias", Some("none")),
    ("rank_pattern", None),
    ("alpha_pattern", None),
    ("layers_to_transform", None),
    ("modules_to_save", None),
    ("exclude_modules", None),
    ("target_parameters", None),
    ("trainable_token_indices", None),
    ("layer_replication", None),
    ("use_qalora", None),
    ("alora_invocation_tokens", None),
    ("use_bdlora", None),
    ("arrow_config", None),
    ("kasa_config", None),
    ("monteclora_config", None),
    ("velora_config", None),
];

/// Keys read above or that do not change the merged weights (initialisation, training, names).
const KNOWN_KEYS: &[&str] = &[
    "peft_type",
    "r",
    "lora_alpha",
    "use_rslora",
    "fan_in_fan_out",
    "target_modules",
    "layers_pattern",
    "base_model_name_or_path",
    "revision",
    "task_type",
    "inference_mode",
    "init_lora_weights",
    "lora_dropout",
    "loftq_config",
    "eva_config",
    "corda_config",
    "lora_ga_config",
    "megatron_config",
    "megatron_core",
    "auto_mapping",
    "peft_version",
    "qalora_group_size",
    "ensure_weight_tying",
];

fn is_neutral(value: &Value, neutral: Option<&str>) -> bool {
    match (value, neutral) {
        (Value::Null, _) | (Value::Bool(false), _) => true,
        (Value::Array(a), _) => a.is_empty(),
        (Value::Object(o), _) => o.is_empty(),
        (Value::String(s), Some(n)) => s == n,
        _ => false,
    }
}

/// One module's adapter: `a` is `[rank, in]`, `b` is `[out, rank]`; `base` replaces the base
/// weight when the adapter saved one (`….base_layer.weight`, PEFT's `save_embedding_layers`,
/// e.g. for an `lm_head` target), as loading the adapter into PEFT does.
#[derive(Debug, Clone)]
struct LoraPair {
    a: Vec<f32>,
    b: Vec<f32>,
    base: Option<Vec<f32>>,
    rank: usize,
    scale: f32,
}

impl LoraPair {
    /// `w [out, in] += (b · a) · scale`, as PEFT's merge computes it (product, then scale).
    fn merge_into(&self, w: &mut [f32], inp: usize) {
        let mut delta = vec![0f32; inp];
        for (o, row) in w.chunks_exact_mut(inp).enumerate() {
            delta.iter_mut().for_each(|d| *d = 0.0);
            for k in 0..self.rank {
                let bk = self.b[o * self.rank + k];
                for (d, a) in delta.iter_mut().zip(&self.a[k * inp..(k + 1) * inp]) {
                    *d += bk * a;
                }
            }
            for (x, d) in row.iter_mut().zip(&delta) {
                *x += d * self.scale;
            }
        }
    }
}

/// A base store whose adapted tensors come out merged.
struct MergedStore {
    base: Box<dyn TensorStore>,
    /// By base tensor name (`….q_proj.weight`).
    pairs: BTreeMap<String, LoraPair>,
}

impl TensorStore for MergedStore {
    fn names(&self) -> Vec<String> {
        self.base.names()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let mut info = self.base.info(name)?;
        if self.pairs.contains_key(name) {
            info.dtype = format!("{}+LoRA", info.dtype);
        }
        Some(info)
    }

    fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        let mut w = match self.pairs.get(name).and_then(|p| p.base.clone()) {
            Some(saved) => saved,
            None => self.base.load_f32(name)?,
        };
        if let Some(pair) = self.pairs.get(name) {
            let inp = pair.a.len() / pair.rank;
            pair.merge_into(&mut w, inp);
        }
        Ok(w)
    }
}

fn lora_error(path: &Path, problem: impl Into<String>) -> CheckpointError {
    CheckpointError::Lora {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// The parsed `adapter_config.json`.
struct AdapterConfig {
    rank: usize,
    alpha: f64,
    use_rslora: bool,
    targets: Targets,
}

fn read_config(path: &Path) -> Result<AdapterConfig> {
    let text = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => CheckpointError::MissingFile {
            path: path.parent().unwrap_or(path).to_path_buf(),
            what: ADAPTER_CONFIG.into(),
        },
        _ => CheckpointError::Io {
            path: path.to_path_buf(),
            source: e,
        },
    })?;
    let json: Value = serde_json::from_slice(&text).map_err(|e| CheckpointError::Json {
        path: path.to_path_buf(),
        source: e,
    })?;
    let f = JsonFields::new(path, &json)?;
    if let Some(kind) = f.str_opt("peft_type")? {
        if kind != "LORA" {
            return Err(f.unsupported("peft_type", format!("`{kind}` (only LORA adapters)")));
        }
    }
    for (key, value) in f.object {
        let known =
            KNOWN_KEYS.contains(&key.as_str()) || REFUSED_KEYS.iter().any(|(k, _)| k == key);
        if !known && !is_neutral(value, None) {
            tracing::warn!(path = %path.display(), key = key.as_str(), %value, "adapter_config.json key not read");
        }
    }
    for &(key, neutral) in REFUSED_KEYS {
        if let Some(value) = f.get(key) {
            if !is_neutral(value, neutral) {
                return Err(f.unsupported(key, format!("{value} (not implemented for LoRA merge)")));
            }
        }
    }
    let rank = f.positive("r")?;
    // PEFT's LoraConfig default
    let alpha = f.f64_opt("lora_alpha")?.unwrap_or(8.0);
    if !alpha.is_finite() {
        return Err(f.bad("lora_alpha", "must be a finite number"));
    }
    let use_rslora = f.bool_opt("use_rslora")?.unwrap_or(false);
    if f.bool_opt("fan_in_fan_out")?.unwrap_or(false) {
        // PEFT does the same for torch.nn.Linear targets (every target a decoder has).
        tracing::warn!(
            path = %path.display(),
            "fan_in_fan_out is true but every target is a Linear layer: treated as false, as PEFT does"
        );
    }
    let targets = match f.get("target_modules") {
        None => {
            return Err(f.bad(
                "target_modules",
                "missing (PEFT writes the resolved list into a saved adapter)",
            ))
        }
        Some(Value::String(s)) if s == "all-linear" => Targets::AllLinear,
        Some(Value::String(s)) => {
            let re = fancy_regex::Regex::new(&format!("^(?:{s})$"))
                .map_err(|e| f.bad("target_modules", format!("bad regular expression: {e}")))?;
            Targets::Regex(s.clone(), re)
        }
        Some(Value::Array(items)) => {
            let mut names = Vec::with_capacity(items.len());
            for item in items {
                let name = item.as_str().ok_or_else(|| {
                    f.bad("target_modules", format!("expected strings, found {item}"))
                })?;
                names.push(name.to_string());
            }
            if names.is_empty() {
                return Err(f.bad("target_modules", "empty list"));
            }
            names.sort();
            Targets::Names(names)
        }
        Some(other) => {
            return Err(f.bad(
                "target_modules",
                format!("expected a list of names or a regular expression, found {other}"),
            ))
        }
    };
    Ok(AdapterConfig {
        rank,
        alpha,
        use_rslora,
        targets,
    })
}

/// Splits `base_model.model.<module>.{lora_A,lora_B,base_layer}.weight` into the module and the
/// slot (0: A, 1: B, 2: a saved base weight).
fn parse_tensor_name(name: &str) -> Option<(&str, usize)> {
    let rest = name.strip_prefix("base_model.model.")?;
    [".lora_A.weight", ".lora_B.weight", ".base_layer.weight"]
        .iter()
        .enumerate()
        .find_map(|(slot, suffix)| rest.strip_suffix(suffix).map(|m| (m, slot)))
}

/// `model.layers.{i}.…` → `i`.
fn layer_of(module: &str) -> Option<usize> {
    module
        .strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Opens the adapter in `dir`, checks it against `checkpoint` and returns the checkpoint with the
/// adapter merged into its tensors (lazily, in fp32, as each is loaded), the adapter's files
/// among its sources and its [`LoraRecord`] set.
pub fn apply_lora(mut checkpoint: Checkpoint, dir: &Path) -> Result<Checkpoint> {
    if checkpoint.lora.is_some() {
        return Err(lora_error(
            dir,
            "the checkpoint already has an adapter merged",
        ));
    }
    if !dir.is_dir() {
        return Err(if dir.exists() {
            lora_error(dir, "not a directory (expected a PEFT adapter directory)")
        } else {
            CheckpointError::NotFound {
                path: dir.to_path_buf(),
            }
        });
    }
    let config_path = dir.join(ADAPTER_CONFIG);
    let weights_path = dir.join(ADAPTER_WEIGHTS);
    let config = read_config(&config_path)?;
    if !weights_path.is_file() {
        return Err(CheckpointError::MissingFile {
            path: dir.to_path_buf(),
            what: ADAPTER_WEIGHTS.into(),
        });
    }
    let store = SafetensorsStore::open_file(&weights_path)?;
    let scale = if config.use_rslora {
        config.alpha / (config.rank as f64).sqrt()
    } else {
        config.alpha / config.rank as f64
    };
    let base = &checkpoint.tensors;
    let layers = checkpoint.config.num_hidden_layers;
    let bad = |problem: String| lora_error(&weights_path, problem);

    // the adapter's tensors, by module
    let mut found: BTreeMap<String, [Option<String>; 3]> = BTreeMap::new();
    for name in store.names() {
        if name.contains("lora_embedding_") {
            return Err(bad(format!(
                "tensor `{name}`: embedding adapters are not supported"
            )));
        }
        if name.ends_with("lora_magnitude_vector") || name.contains(".lora_magnitude_vector.") {
            return Err(bad(format!("tensor `{name}`: DoRA is not supported")));
        }
        let (module, slot) = parse_tensor_name(&name).ok_or_else(|| {
            bad(format!(
                "tensor `{name}` is not a PEFT LoRA weight \
                 (base_model.model.<module>.lora_A.weight / lora_B.weight); whole modules saved \
                 in an adapter (modules_to_save) are not supported"
            ))
        })?;
        found.entry(module.to_string()).or_default()[slot] = Some(name.clone());
    }
    if found.is_empty() {
        return Err(bad("holds no LoRA tensors".into()));
    }

    // the base's linear modules: 2-D `<module>.weight` tensors, embeddings excepted; modules the
    // checkpoint stores fused (Phi-3's qkv_proj, gate_up_proj) instead of the parts they are
    // presented as, as PEFT sees the model
    let fused: BTreeMap<String, crate::store::FusedModule> = base
        .fused_modules()
        .into_iter()
        .map(|f| (f.module.clone(), f))
        .collect();
    let parts: BTreeSet<&str> = fused
        .values()
        .flat_map(|f| f.parts.iter().map(|(p, _)| p.as_str()))
        .collect();
    let base_modules: BTreeSet<String> = base
        .names()
        .into_iter()
        .filter_map(|n| n.strip_suffix(".weight").map(str::to_string))
        .filter(|m| {
            !m.ends_with("embed_tokens")
                && !parts.contains(m.as_str())
                && base
                    .info(&format!("{m}.weight"))
                    .is_some_and(|i| i.shape.len() == 2)
        })
        .chain(fused.keys().cloned())
        .collect();
    let mut linear_kinds: Vec<String> = base_modules
        .iter()
        .map(|m| m.rsplit('.').next().unwrap_or(m).to_string())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if checkpoint.config.tie_word_embeddings {
        linear_kinds.push("lm_head (tied to the embeddings)".into());
    }
    let selected: BTreeSet<&String> = base_modules
        .iter()
        .filter(|m| config.targets.matches(m))
        .collect();
    match &config.targets {
        Targets::Names(names) => {
            for n in names {
                if n == "lm_head" && checkpoint.config.tie_word_embeddings {
                    return Err(lora_error(
                        &config_path,
                        "target module `lm_head`: the base ties the LM head to the embeddings; \
                         a merged lm_head adapter would change both (not supported)",
                    ));
                }
                if !base_modules.iter().any(|m| name_matches(n, m)) {
                    return Err(lora_error(
                        &config_path,
                        format!(
                            "target module `{n}` matches no module of the base model (its linear \
                             modules: {})",
                            linear_kinds.join(", ")
                        ),
                    ));
                }
            }
        }
        Targets::Regex(pattern, _) if selected.is_empty() => {
            return Err(lora_error(
                &config_path,
                format!(
                    "target_modules `{pattern}` matches no module of the base model (its linear \
                     modules: {})",
                    linear_kinds.join(", ")
                ),
            ))
        }
        Targets::Regex(..) | Targets::AllLinear => {}
    }

    // the layer count first: the clearest sign of an adapter made for another base
    if let Some((module, layer)) = found
        .keys()
        .filter_map(|m| layer_of(m).map(|l| (m, l)))
        .max_by_key(|(_, l)| *l)
    {
        if layer >= layers {
            return Err(bad(format!(
                "module `{module}`: the adapter was made for another base model \
                 (it adapts layer {layer}, the base has {layers} layers)"
            )));
        }
    }
    let mut pairs = BTreeMap::new();
    for (module, [a_name, b_name, saved_base]) in &found {
        let weight = format!("{module}.weight");
        let shape = match fused.get(module) {
            Some(f) => Some(f.shape.clone()),
            None => base_modules
                .contains(module)
                .then(|| base.info(&weight).map(|i| i.shape))
                .flatten(),
        };
        let Some(shape) = shape else {
            return Err(bad(format!(
                "module `{module}` is not a linear module of the base model (the adapter was \
                 made for another base?)"
            )));
        };
        if !config.targets.matches(module) {
            return Err(bad(format!(
                "module `{module}` is not selected by target_modules {:?} of {ADAPTER_CONFIG}",
                config.targets.describe()
            )));
        }
        let (a_name, b_name) = match (a_name, b_name) {
            (Some(a), Some(b)) => (a, b),
            (None, _) => return Err(bad(format!("module `{module}` has no lora_A"))),
            (_, None) => return Err(bad(format!("module `{module}` has no lora_B"))),
        };
        let (out, inp) = (shape[0], shape[1]);
        let a_shape = store.info(a_name).map(|i| i.shape).unwrap_or_default();
        let b_shape = store.info(b_name).map(|i| i.shape).unwrap_or_default();
        if a_shape.len() != 2 || b_shape.len() != 2 {
            return Err(bad(format!(
                "module `{module}`: lora_A {a_shape:?} and lora_B {b_shape:?} must be matrices"
            )));
        }
        if a_shape[0] != config.rank || b_shape[1] != config.rank {
            return Err(bad(format!(
                "module `{module}`: rank mismatch: lora_A {a_shape:?} and lora_B {b_shape:?}, \
                 but {ADAPTER_CONFIG} has r = {}",
                config.rank
            )));
        }
        if a_shape[1] != inp || b_shape[0] != out {
            return Err(bad(format!(
                "module `{module}`: the adapter was made for another base model: it maps \
                 {} → {} features (lora_A {a_shape:?}, lora_B {b_shape:?}), the base weight is \
                 [{out}, {inp}] (hidden size {})",
                a_shape[1], b_shape[0], checkpoint.config.hidden_size
            )));
        }
        let saved_base = match saved_base {
            Some(name) => {
                let saved = store.info(name).map(|i| i.shape).unwrap_or_default();
                if saved != shape {
                    return Err(bad(format!(
                        "tensor `{name}` has shape {saved:?}, the base weight is {shape:?} (the \
                         adapter was made for another base model)"
                    )));
                }
                Some(store.load_f32(name)?)
            }
            None => None,
        };
        let pair = LoraPair {
            a: store.load_f32(a_name)?,
            b: store.load_f32(b_name)?,
            base: saved_base,
            rank: config.rank,
            scale: scale as f32,
        };
        match fused.get(module) {
            // `(B·A)[rows] = B[rows]·A`: each part merges its rows of the fused update
            Some(f) => {
                for (part, rows) in &f.parts {
                    let r = config.rank;
                    pairs.insert(
                        format!("{part}.weight"),
                        LoraPair {
                            a: pair.a.clone(),
                            b: pair.b[rows.start * r..rows.end * r].to_vec(),
                            base: pair
                                .base
                                .as_ref()
                                .map(|w| w[rows.start * inp..rows.end * inp].to_vec()),
                            ..pair.clone()
                        },
                    );
                }
            }
            None => {
                pairs.insert(weight, pair);
            }
        }
    }
    for module in &selected {
        if !found.contains_key(*module) {
            return Err(bad(format!(
                "target_modules selects `{module}` but the adapter has no lora_A/lora_B for it"
            )));
        }
    }

    let record = LoraRecord {
        dir: dir.to_path_buf(),
        adapter_sha256: hash_file(&weights_path)?.sha256,
        config_sha256: hash_file(&config_path)?.sha256,
        rank: config.rank,
        lora_alpha: config.alpha,
        use_rslora: config.use_rslora,
        scale,
        target_modules: config.targets.describe(),
        merged_tensors: pairs.keys().cloned().collect(),
    };
    tracing::info!(
        dir = %dir.display(),
        rank = record.rank,
        scale = record.scale,
        tensors = record.merged_tensors.len(),
        "LoRA adapter merged (fp32, on load)"
    );
    let base = std::mem::replace(
        &mut checkpoint.tensors,
        Box::new(crate::store::MemoryStore::new()),
    );
    checkpoint.tensors = Box::new(MergedStore { base, pairs });
    checkpoint.source_paths.push(config_path);
    checkpoint.source_paths.push(weights_path);
    checkpoint.lora = Some(record);
    Ok(checkpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_name_matching() {
        assert!(name_matches("q_proj", "model.layers.0.self_attn.q_proj"));
        assert!(name_matches(
            "self_attn.q_proj",
            "model.layers.0.self_attn.q_proj"
        ));
        assert!(!name_matches("proj", "model.layers.0.self_attn.q_proj"));
        assert!(name_matches("lm_head", "lm_head"));
        assert_eq!(
            parse_tensor_name("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"),
            Some(("model.layers.1.mlp.up_proj", 1))
        );
        assert_eq!(layer_of("model.layers.12.mlp.up_proj"), Some(12));
    }

    #[test]
    fn merge_is_w_plus_scaled_b_times_a() {
        // w [2, 3], rank 1: a = [1, 2, 3], b = [1, -1], scale 0.5
        let pair = LoraPair {
            a: vec![1.0, 2.0, 3.0],
            b: vec![1.0, -1.0],
            base: None,
            rank: 1,
            scale: 0.5,
        };
        let mut w = vec![0.0; 6];
        pair.merge_into(&mut w, 3);
        assert_eq!(w, vec![0.5, 1.0, 1.5, -0.5, -1.0, -1.5]);
    }
}
