//! The encoder bundle: `encoder.mlpackage` (one function per length bucket), `host.safetensors`
//! (embedding tables in the bundle precision; a classification head in f32), `tokenizer.json`,
//! and `anemone.json` with `"kind": "encoder"`, the buckets, the pooling, provenance and the
//! sha256 of every file. Written in a temporary directory and renamed into place.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anemone_checkpoint::SourceFile;
use anemone_mil::staging::{ReplacePolicy, Staging};
use anemone_mil::{write_package, WriteOptions};
use half::f16;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde::{Deserialize, Serialize};

use super::ane::{bucket_signature, build_encoder_program, EncoderGraphWeights};
use super::reference::{EncoderWeights, Head, Linear, Norm};
use super::{Buckets, EncoderCheckpoint, EncoderConfig, EncoderTokenizer, Pooling};
use crate::ane::{FunctionSignature, Precision, WeightCompressor};
use crate::bundle::manifest::{FileHash, ToolInfo, HOST_FILE, MANIFEST_FILE, TOKENIZER_FILE};
use crate::bundle::read::hash_tree;
use crate::bundle::BundleError;

pub const SCHEMA_VERSION: u32 = 1;
pub const PACKAGE: &str = "encoder.mlpackage";
pub const KIND: &str = "encoder";
/// `conversion.head` of a bundle whose functions output `logits`.
pub const HEAD_IN_PACKAGE: &str = "package";
/// `conversion.head` of a bundle whose head runs on the host from `host.safetensors`.
pub const HEAD_ON_HOST: &str = "host-fp32";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderManifest {
    pub schema_version: u32,
    /// Always `encoder` (decoder manifests have no `kind`).
    pub kind: String,
    pub tool: ToolInfo,
    pub config: EncoderConfig,
    pub pooling: Pooling,
    pub conversion: EncoderConversion,
    pub package: PackageEntry,
    pub host: EncoderHost,
    pub tokenizer: Option<String>,
    pub provenance: Vec<SourceFile>,
    pub files: BTreeMap<String, FileHash>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderConversion {
    pub spec_version: i32,
    pub opset: String,
    pub precision: Precision,
    /// Length buckets, ascending: function `len_{T}` per bucket.
    pub buckets: Vec<usize>,
    pub mask_value: f32,
    /// How LayerNorm is written in the graph.
    pub layer_norm: String,
    /// Where the classification head runs, when the model has one: `package` (output
    /// `logits` of every function; bundles written before it: `host-fp32`, head tensors in the
    /// host file).
    pub head: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageEntry {
    pub path: String,
    pub functions: Vec<FunctionSignature>,
    pub weight_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncoderHost {
    pub path: String,
    pub tensors: Vec<String>,
}

/// What `anemone convert` does with an encoder.
pub struct EncoderConvertOptions<'a> {
    pub lengths: Vec<usize>,
    pub precision: Precision,
    pub force: bool,
    pub compressor: &'a dyn WeightCompressor,
    /// Where a classification head runs.
    pub head: HeadPlacement,
}

/// Where an encoder's classification head runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadPlacement {
    /// In the package, as 1×1 convs: every function outputs `logits` (the default; every
    /// supported head is ANE-friendly).
    #[default]
    Package,
    /// On the host in fp32, from `host.safetensors`.
    Host,
}

impl std::str::FromStr for HeadPlacement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "package" => Ok(HeadPlacement::Package),
            "host" => Ok(HeadPlacement::Host),
            other => Err(format!("`{other}`: expected `package` or `host`")),
        }
    }
}

impl HeadPlacement {
    /// The manifest's `conversion.head` value.
    pub fn name(self) -> &'static str {
        match self {
            HeadPlacement::Package => HEAD_IN_PACKAGE,
            HeadPlacement::Host => HEAD_ON_HOST,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError {
    let path = path.to_path_buf();
    move |source| BundleError::Io { path, source }
}

fn encoder_error(e: super::EncoderError) -> BundleError {
    BundleError::Layout {
        path: PathBuf::from("(encoder)"),
        problem: e.to_string(),
    }
}

/// Converts an encoder checkpoint into a bundle at `out`.
pub fn convert_encoder(
    ck: &EncoderCheckpoint,
    out: &Path,
    options: &EncoderConvertOptions,
) -> Result<EncoderManifest, BundleError> {
    let buckets = Buckets::new(&options.lengths, ck.config.max_tokens()).map_err(encoder_error)?;
    let inputs: Vec<&Path> = ck.source_paths.iter().map(PathBuf::as_path).collect();
    let policy = ReplacePolicy {
        force: options.force,
        is_ours: &crate::bundle::is_bundle_dir,
        inputs: &inputs,
    };
    let staging = Staging::begin(out, &policy)?;
    // On an error the staging is dropped, which removes its partial directory.
    let manifest = write_contents(ck, staging.path(), &buckets, options)?;
    staging.commit(&policy)?;
    Ok(manifest)
}

fn write_contents(
    ck: &EncoderCheckpoint,
    dir: &Path,
    buckets: &Buckets,
    options: &EncoderConvertOptions,
) -> Result<EncoderManifest, BundleError> {
    let config = &ck.config;
    let weights = EncoderWeights::load(ck).map_err(encoder_error)?;
    let in_package = options.head == HeadPlacement::Package;
    let host_head = if in_package {
        None
    } else {
        weights.head.as_ref()
    };
    let host = write_host(
        config,
        &weights,
        host_head,
        &dir.join(HOST_FILE),
        options.precision,
    )?;
    let graph = EncoderGraphWeights::prepare(
        config,
        &weights,
        options.precision,
        options.compressor,
        in_package,
    )?;
    drop(weights);
    let program = build_encoder_program(config, &graph, options.precision, buckets.lengths())?;
    let summary = write_package(&program, &dir.join(PACKAGE), &WriteOptions::default())?;
    let functions = buckets
        .lengths()
        .iter()
        .zip(program.functions())
        .map(|(&t, f)| {
            let described = bucket_signature(config, options.precision, t, in_package);
            FunctionSignature::of_function(f, Some(&described))
        })
        .collect();
    let tokenizer = match &ck.tokenizer {
        Some(tok) => {
            let json = tok
                .tokenizer
                .to_string(false)
                .map_err(|e| BundleError::Tokenizer {
                    problem: format!("cannot serialize the tokenizer: {e}"),
                })?;
            let path = dir.join(TOKENIZER_FILE);
            fs::write(&path, json).map_err(io(&path))?;
            Some(TOKENIZER_FILE.to_string())
        }
        None => None,
    };
    let (files, _) = hash_tree(dir, &BTreeMap::new())?;
    let manifest = EncoderManifest {
        schema_version: SCHEMA_VERSION,
        kind: KIND.into(),
        tool: ToolInfo {
            name: "anemone".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        config: config.clone(),
        pooling: ck.pooling.clone(),
        conversion: EncoderConversion {
            spec_version: anemone_mil::SpecVersion::V9.number(),
            opset: anemone_mil::SpecVersion::V9.opset().into(),
            precision: options.precision,
            buckets: buckets.lengths().to_vec(),
            mask_value: crate::ane::options::MASK_NEG,
            layer_norm: "rms_norm(x - mean(x)) max-scaled, then gamma, beta".into(),
            head: (!config.labels.is_empty()).then(|| options.head.name().to_string()),
        },
        package: PackageEntry {
            path: PACKAGE.into(),
            functions,
            weight_bytes: summary.weight_bytes,
        },
        host,
        tokenizer,
        provenance: ck.provenance()?,
        files,
        compression: options.compressor.describe(),
    };
    let path = dir.join(MANIFEST_FILE);
    let mut text = serde_json::to_string_pretty(&manifest).map_err(|e| BundleError::Json {
        path: path.clone(),
        source: e,
    })?;
    text.push('\n');
    fs::write(&path, text).map_err(io(&path))?;
    Ok(manifest)
}

impl EncoderCheckpoint {
    /// sha256 of every source file.
    pub fn provenance(&self) -> anemone_checkpoint::Result<Vec<SourceFile>> {
        self.source_paths
            .iter()
            .map(|p| anemone_checkpoint::hash_file(p))
            .collect()
    }
}

const WORD: &str = "embeddings.word_embeddings.weight";
const POSITION: &str = "embeddings.position_embeddings.weight";
const TOKEN_TYPE: &str = "embeddings.token_type_embeddings.weight";
const HEAD_A: &str = "head.dense";
const HEAD_B: &str = "head.out";
const HEAD_NORM: &str = "head.norm";

/// A host tensor: name, shape, dtype and little-endian bytes.
type HostTensor = (String, Vec<usize>, (Dtype, Vec<u8>));

fn write_host(
    config: &EncoderConfig,
    w: &EncoderWeights,
    host_head: Option<&Head>,
    path: &Path,
    precision: Precision,
) -> Result<EncoderHost, BundleError> {
    let h = config.hidden_size;
    let table = |v: &[f32]| -> (Dtype, Vec<u8>) {
        match precision {
            Precision::Fp16 => (
                Dtype::F16,
                v.iter()
                    .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                    .collect(),
            ),
            Precision::Fp32 => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        }
    };
    let f32_bytes = |v: &[f32]| -> (Dtype, Vec<u8>) {
        (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    };
    let mut tensors: Vec<HostTensor> =
        vec![(WORD.into(), vec![config.vocab_size, h], table(&w.word))];
    if let Some(position) = &w.position {
        tensors.push((
            POSITION.into(),
            vec![config.max_position_embeddings, h],
            table(position),
        ));
    }
    if let Some(tt) = &w.token_type {
        tensors.push((
            TOKEN_TYPE.into(),
            vec![config.type_vocab_size, h],
            table(tt),
        ));
    }
    let linears: Vec<(&str, &Linear)> = match host_head {
        Some(Head::BertPooler { pooler, classifier }) => {
            vec![(HEAD_A, pooler), (HEAD_B, classifier)]
        }
        Some(Head::Roberta { dense, out_proj }) => vec![(HEAD_A, dense), (HEAD_B, out_proj)],
        Some(Head::ModernBert {
            dense,
            norm,
            classifier,
            ..
        }) => {
            for (suffix, v) in [("weight", &norm.w), ("bias", &norm.b)] {
                tensors.push((format!("{HEAD_NORM}.{suffix}"), vec![h], f32_bytes(v)));
            }
            vec![(HEAD_A, dense), (HEAD_B, classifier)]
        }
        None => Vec::new(),
    };
    for (name, l) in linears {
        tensors.push((
            format!("{name}.weight"),
            vec![l.n_out, l.n_in],
            f32_bytes(&l.w),
        ));
        tensors.push((format!("{name}.bias"), vec![l.n_out], f32_bytes(&l.b)));
    }
    let err = |e: safetensors::SafeTensorError| BundleError::Safetensors {
        path: path.to_path_buf(),
        problem: e.to_string(),
    };
    let views = tensors
        .iter()
        .map(|(n, shape, (dtype, bytes))| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (n.clone(), v))
                .map_err(err)
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(err)?;
    Ok(EncoderHost {
        path: HOST_FILE.into(),
        tensors: tensors.into_iter().map(|(n, _, _)| n).collect(),
    })
}

/// The `kind` of the bundle at `dir`: `encoder`, or `decoder` for a manifest without one.
pub fn bundle_kind(dir: &Path) -> Result<crate::families::ModelKind, BundleError> {
    let path = dir.join(MANIFEST_FILE);
    let value = read_json(&path)?;
    match value.get("kind").and_then(|k| k.as_str()) {
        None => Ok(crate::families::ModelKind::Decoder),
        Some(KIND) => Ok(crate::families::ModelKind::Encoder),
        Some(other) => Err(BundleError::Schema {
            path,
            problem: format!("unknown bundle kind `{other}` (encoder, or none for a decoder)"),
        }),
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, BundleError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|e| BundleError::Json {
        path: path.to_path_buf(),
        source: e,
    })
}

/// An encoder bundle opened for running: manifest, host tables (f32), tokenizer.
pub struct EncoderBundle {
    pub dir: PathBuf,
    pub manifest: EncoderManifest,
    pub weights_host: HostTables,
    pub tokenizer: Option<EncoderTokenizer>,
}

/// The host part of an encoder bundle.
pub struct HostTables {
    word: Vec<f32>,
    position: Option<Vec<f32>>,
    token_type: Option<Vec<f32>>,
    pub head: Option<Head>,
}

impl EncoderBundle {
    /// Reads and checks the manifest (a decoder bundle is an error saying so) and the host file.
    pub fn open(dir: &Path) -> Result<Self, BundleError> {
        let path = dir.join(MANIFEST_FILE);
        let value = read_json(&path)?;
        if value.get("kind").and_then(|k| k.as_str()) != Some(KIND) {
            return Err(BundleError::Schema {
                path,
                problem: "a decoder bundle, not an encoder bundle (use `anemone generate` / `anemone gate`)".into(),
            });
        }
        let manifest: EncoderManifest =
            serde_json::from_value(value).map_err(|e| BundleError::Json {
                path: path.clone(),
                source: e,
            })?;
        if manifest.schema_version != SCHEMA_VERSION {
            return Err(BundleError::Schema {
                path,
                problem: format!(
                    "schema_version {}; this anemone reads {SCHEMA_VERSION}",
                    manifest.schema_version
                ),
            });
        }
        crate::families::encoder_by_name(&manifest.config.architecture).map_err(|e| {
            BundleError::Schema {
                path: path.clone(),
                problem: e.to_string(),
            }
        })?;
        let host_path = dir.join(&manifest.host.path);
        let bytes = fs::read(&host_path).map_err(io(&host_path))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
            BundleError::Safetensors {
                path: host_path.clone(),
                problem: e.to_string(),
            }
        })?;
        let load = |name: &str| -> Result<Option<Vec<f32>>, BundleError> {
            let Ok(view) = st.tensor(name) else {
                return Ok(None);
            };
            let data = view.data();
            match view.dtype() {
                Dtype::F16 => Ok(Some(
                    data.chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                        .collect(),
                )),
                Dtype::F32 => Ok(Some(
                    data.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                )),
                other => Err(BundleError::Safetensors {
                    path: host_path.clone(),
                    problem: format!("tensor `{name}` has dtype {other:?} (F16 or F32 expected)"),
                }),
            }
        };
        let need = |name: &str| -> Result<Vec<f32>, BundleError> {
            load(name)?.ok_or_else(|| BundleError::Safetensors {
                path: host_path.clone(),
                problem: format!("tensor `{name}` is missing"),
            })
        };
        let c = &manifest.config;
        let n = c.labels.len();
        let linear = |name: &str, n_out: usize| -> Result<Linear, BundleError> {
            Ok(Linear {
                w: need(&format!("{name}.weight"))?,
                b: need(&format!("{name}.bias"))?,
                n_out,
                n_in: c.hidden_size,
            })
        };
        let head = if n == 0 || manifest.conversion.head.as_deref() != Some(HEAD_ON_HOST) {
            None
        } else {
            let (a, b) = (linear(HEAD_A, c.hidden_size)?, linear(HEAD_B, n)?);
            Some(if let Some(r) = c.rope() {
                Head::ModernBert {
                    pooling: r.head_pooling,
                    dense: a,
                    norm: Norm {
                        w: need(&format!("{HEAD_NORM}.weight"))?,
                        b: need(&format!("{HEAD_NORM}.bias"))?,
                    },
                    eps: c.layer_norm_eps,
                    classifier: b,
                }
            } else if crate::families::bert::is_roberta(&c.model_type) {
                Head::Roberta {
                    dense: a,
                    out_proj: b,
                }
            } else {
                Head::BertPooler {
                    pooler: a,
                    classifier: b,
                }
            })
        };
        let weights_host = HostTables {
            word: need(WORD)?,
            position: if c.rope().is_some() {
                None
            } else {
                Some(need(POSITION)?)
            },
            token_type: load(TOKEN_TYPE)?,
            head,
        };
        let tokenizer = match &manifest.tokenizer {
            Some(rel) => Some(EncoderTokenizer::from_file(&dir.join(rel)).map_err(encoder_error)?),
            None => None,
        };
        Ok(EncoderBundle {
            dir: dir.to_path_buf(),
            manifest,
            weights_host,
            tokenizer,
        })
    }

    pub fn package_path(&self) -> PathBuf {
        self.dir.join(&self.manifest.package.path)
    }

    pub fn buckets(&self) -> Result<Buckets, super::EncoderError> {
        Buckets::new(
            &self.manifest.conversion.buckets,
            self.manifest.config.max_tokens(),
        )
    }

    /// Word + position + token-type embeddings of `ids` (`[tokens, hidden]`, f32 sums; types
    /// all 0 when `type_ids` is `None`).
    pub fn embed_raw(
        &self,
        index: usize,
        ids: &[u32],
        type_ids: Option<&[u32]>,
    ) -> Result<Vec<f32>, super::EncoderError> {
        let c = &self.manifest.config;
        embed_tables(
            c,
            Tables {
                word: &self.weights_host.word,
                position: self.weights_host.position.as_deref(),
                token_type: self.weights_host.token_type.as_deref(),
            },
            index,
            ids,
            type_ids,
        )
    }
}

/// The host embedding tables (`position` is `None` with rotary positions, `token_type` without
/// token types).
#[derive(Debug, Clone, Copy)]
pub struct Tables<'a> {
    pub word: &'a [f32],
    pub position: Option<&'a [f32]>,
    pub token_type: Option<&'a [f32]>,
}

/// Word + position + token-type rows of `ids` from the given tables.
pub fn embed_tables(
    config: &EncoderConfig,
    tables: Tables<'_>,
    index: usize,
    ids: &[u32],
    type_ids: Option<&[u32]>,
) -> Result<Vec<f32>, super::EncoderError> {
    let Tables {
        word,
        position,
        token_type,
    } = tables;
    let h = config.hidden_size;
    if let Some(types) = type_ids {
        if types.len() != ids.len() {
            return Err(super::EncoderError::Tokenizer {
                problem: format!(
                    "input {index}: {} token types for {} tokens",
                    types.len(),
                    ids.len()
                ),
            });
        }
    }
    if ids.len() > config.max_tokens() {
        return Err(super::EncoderError::TooLong {
            index,
            tokens: ids.len(),
            largest: config.max_tokens(),
        });
    }
    let mut x = vec![0f32; ids.len() * h];
    for (p, (&id, row)) in ids.iter().zip(x.chunks_exact_mut(h)).enumerate() {
        if id as usize >= config.vocab_size {
            return Err(super::EncoderError::TokenId {
                index,
                id,
                vocab: config.vocab_size,
            });
        }
        row.copy_from_slice(&word[id as usize * h..(id as usize + 1) * h]);
        if let Some(position) = position {
            let pos = config.position_offset + p;
            let q = &position[pos * h..(pos + 1) * h];
            row.iter_mut().zip(q).for_each(|(v, q)| *v += q);
        }
        if let Some(tt) = token_type {
            let ty = type_ids.map_or(0, |t| t[p] as usize);
            let rows = tt.len() / h;
            if ty >= rows {
                return Err(super::EncoderError::TokenId {
                    index,
                    id: ty as u32,
                    vocab: rows,
                });
            }
            row.iter_mut()
                .zip(&tt[ty * h..(ty + 1) * h])
                .for_each(|(v, t)| *v += t);
        }
    }
    Ok(x)
}
