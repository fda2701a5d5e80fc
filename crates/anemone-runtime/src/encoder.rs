//! Running an encoder: from a checkpoint (the fp32 reference) or from an encoder bundle (the
//! MIL executor, fp16 by default). Inputs are tokenized without truncation, each goes to the
//! smallest length bucket holding it (an input longer than the largest is an error naming both
//! lengths), and inputs are run grouped by bucket; results come back in input order. A bundle's
//! package runs on any engine of the backend registry (`--backend`).

use std::collections::HashMap;
use std::path::Path;

use anemone_exec::{OpOutput, Precision as ExecPrecision, Tensor};
use anemone_models::bundle::BundleError;
use anemone_models::encoder::ane::{hidden_rows, host_inputs, names};
use anemone_models::encoder::bundle::{bundle_kind, EncoderBundle};
use anemone_models::encoder::{
    open_encoder, Buckets, Encoded, EncoderError, EncoderReference, EncoderTokenizer, Pooling,
};
use anemone_models::families::ModelKind;

use crate::backend::{BackendChoice, BackendKind};
use crate::encoder_backend::{load_runner, BucketRunner};

#[derive(Debug, thiserror::Error)]
pub enum EncoderRunError {
    #[error(transparent)]
    Encoder(#[from] EncoderError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Exec(#[from] anemone_exec::ExecError),
    #[error(transparent)]
    Tensor(#[from] anemone_backend::TensorError),
    #[error("{}: {problem}", path.display())]
    Kind {
        path: std::path::PathBuf,
        problem: String,
    },
    #[error("{backend}: {source}")]
    Backend {
        backend: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Registry(Box<crate::pipeline::PipelineError>),
    #[error("per-layer outputs need the executor backend ({backend} cannot show them)")]
    Observe { backend: String },
    #[error("{}: output `{output}` missing from the executor's results", path.display())]
    Output {
        path: std::path::PathBuf,
        output: String,
    },
}

pub type Result<T, E = EncoderRunError> = std::result::Result<T, E>;

/// One input's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Embedded {
    pub index: usize,
    pub tokens: usize,
    /// The length bucket it ran in (`None` for the reference, which runs the input's own
    /// length).
    pub bucket: Option<usize>,
    pub embedding: Vec<f32>,
    /// Classification logits and softmax probabilities (models with a head).
    pub logits: Option<Vec<f32>>,
    pub probabilities: Option<Vec<f32>>,
    /// Wall time of this input's forward, pooling and head (tokenization excluded).
    pub seconds: f64,
}

enum Engine {
    Reference(Box<EncoderReference>),
    Bundle {
        bundle: Box<EncoderBundle>,
        runner: Box<dyn BucketRunner>,
        buckets: Buckets,
    },
}

/// An encoder ready to run.
pub struct Encoder {
    engine: Engine,
    tokenizer: Option<EncoderTokenizer>,
    /// What it runs, for reports (`reference fp32` / `executor fp16`).
    pub description: String,
}

impl Encoder {
    /// A bundle directory (has `anemone.json`) runs on the executor in `precision`; anything
    /// else is opened as a Hugging Face encoder checkpoint and runs the reference.
    pub fn open(path: &Path, precision: ExecPrecision) -> Result<Self> {
        Self::open_on(path, &BackendChoice::new(BackendKind::Executor, precision))
    }

    /// Like [`Encoder::open`], a bundle running on the engine `choice` names.
    pub fn open_on(path: &Path, choice: &BackendChoice) -> Result<Self> {
        if path.join(anemone_models::bundle::MANIFEST_FILE).is_file() {
            match bundle_kind(path)? {
                ModelKind::Encoder => Self::open_bundle_on(path, choice),
                ModelKind::Decoder => Err(EncoderRunError::Kind {
                    path: path.to_path_buf(),
                    problem: "is a decoder bundle; embed/classify need an encoder bundle (use `anemone generate` for decoders)".into(),
                }),
            }
        } else {
            Self::open_reference(path)
        }
    }

    pub fn open_reference(path: &Path) -> Result<Self> {
        let ck = open_encoder(path)?;
        let tokenizer = ck.encoder_tokenizer().ok();
        let reference = EncoderReference::load(&ck)?;
        Ok(Encoder {
            engine: Engine::Reference(Box::new(reference)),
            tokenizer,
            description: "reference fp32".into(),
        })
    }

    pub fn open_bundle(path: &Path, precision: ExecPrecision) -> Result<Self> {
        Self::open_bundle_on(path, &BackendChoice::new(BackendKind::Executor, precision))
    }

    pub fn open_bundle_on(path: &Path, choice: &BackendChoice) -> Result<Self> {
        let bundle = EncoderBundle::open(path)?;
        let runner = load_runner(&bundle.package_path(), choice)?;
        let buckets = bundle.buckets()?;
        let tokenizer = bundle.tokenizer.clone();
        Ok(Encoder {
            engine: Engine::Bundle {
                bundle: Box::new(bundle),
                runner,
                buckets,
            },
            tokenizer,
            description: format!("{} {}", choice.kind, choice.precision),
        })
    }

    /// The tokenizer (`None` when the model has no `tokenizer.json`).
    pub fn tokenizer(&self) -> Option<&EncoderTokenizer> {
        self.tokenizer.as_ref()
    }

    pub fn pooling(&self) -> &Pooling {
        match &self.engine {
            Engine::Reference(r) => &r.pooling,
            Engine::Bundle { bundle, .. } => &bundle.manifest.pooling,
        }
    }

    pub fn labels(&self) -> &[String] {
        match &self.engine {
            Engine::Reference(r) => &r.config.labels,
            Engine::Bundle { bundle, .. } => &bundle.manifest.config.labels,
        }
    }

    pub fn buckets(&self) -> Option<&Buckets> {
        match &self.engine {
            Engine::Reference(_) => None,
            Engine::Bundle { buckets, .. } => Some(buckets),
        }
    }

    /// Token ids of every text (errors name the input).
    pub fn tokenize(&self, texts: &[String]) -> Result<Vec<Vec<u32>>> {
        let tok = self.tokenizer.as_ref().ok_or(EncoderError::Tokenizer {
            problem: "this model has no tokenizer.json".into(),
        })?;
        Ok(texts
            .iter()
            .enumerate()
            .map(|(i, t)| tok.encode(i, t))
            .collect::<Result<_, _>>()?)
    }

    /// Token ids and types of every (first, second) text pair (errors name the input).
    pub fn tokenize_pairs(&self, pairs: &[(String, String)]) -> Result<Vec<Encoded>> {
        let tok = self.tokenizer.as_ref().ok_or(EncoderError::Tokenizer {
            problem: "this model has no tokenizer.json".into(),
        })?;
        Ok(pairs
            .iter()
            .enumerate()
            .map(|(i, (a, b))| tok.encode_pair(i, a, b))
            .collect::<Result<_, _>>()?)
    }

    /// Embeds token-id inputs (token types all 0).
    pub fn embed_ids(&self, inputs: &[Vec<u32>]) -> Result<Vec<Embedded>> {
        let encoded: Vec<Encoded> = inputs
            .iter()
            .map(|ids| Encoded {
                ids: ids.clone(),
                type_ids: vec![0; ids.len()],
            })
            .collect();
        self.embed_encoded(&encoded)
    }

    /// Embeds tokenized inputs: all are checked against the buckets first, then run grouped by
    /// bucket.
    pub fn embed_encoded(&self, inputs: &[Encoded]) -> Result<Vec<Embedded>> {
        let counts: Vec<usize> = inputs.iter().map(|i| i.ids.len()).collect();
        let mut out: Vec<Option<Embedded>> = vec![None; inputs.len()];
        match &self.engine {
            Engine::Reference(r) => {
                let max = r.config.max_tokens();
                for (index, &tokens) in counts.iter().enumerate() {
                    if tokens > max {
                        return Err(EncoderError::TooLong {
                            index,
                            tokens,
                            largest: max,
                        }
                        .into());
                    }
                }
                for (index, input) in inputs.iter().enumerate() {
                    let started = std::time::Instant::now();
                    let trace = r.forward_typed(index, &input.ids, Some(&input.type_ids))?;
                    let h = r.config.hidden_size;
                    let logits = r.logits(&trace);
                    let mut done =
                        self.finish(index, None, trace.last(), input.ids.len(), h, logits);
                    done.seconds = started.elapsed().as_secs_f64();
                    out[index] = Some(done);
                }
            }
            Engine::Bundle {
                bundle,
                runner,
                buckets,
            } => {
                for (bucket, members) in buckets.group(&counts)? {
                    for index in members {
                        let input = &inputs[index];
                        let started = std::time::Instant::now();
                        let (last, h, package_logits) =
                            run_bundle(bundle, runner.as_ref(), index, input, bucket, None)?;
                        let tokens = input.ids.len();
                        let logits = package_logits.or_else(|| {
                            bundle
                                .weights_host
                                .head
                                .as_ref()
                                .map(|head| head.logits(&last, tokens))
                        });
                        let mut done = self.finish(index, Some(bucket), &last, tokens, h, logits);
                        done.seconds = started.elapsed().as_secs_f64();
                        out[index] = Some(done);
                    }
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    fn finish(
        &self,
        index: usize,
        bucket: Option<usize>,
        last: &[f32],
        tokens: usize,
        h: usize,
        logits: Option<Vec<f32>>,
    ) -> Embedded {
        let probabilities = logits.as_ref().map(|l| probabilities(l));
        Embedded {
            index,
            tokens,
            bucket,
            embedding: self.pooling().apply(last, tokens, h),
            logits,
            probabilities,
            seconds: 0.0,
        }
    }

    /// The per-layer hidden states (`[tokens, hidden]` each: embeddings, then every layer) of
    /// one input, and its bucket (`None` for the reference).
    pub fn hidden_states(
        &self,
        index: usize,
        ids: &[u32],
    ) -> Result<(Option<usize>, Vec<Vec<f32>>)> {
        match &self.engine {
            Engine::Reference(r) => Ok((None, r.forward(index, ids)?.hidden_states)),
            Engine::Bundle {
                bundle,
                runner,
                buckets,
            } => {
                let bucket = buckets.pick(index, ids.len())?;
                let mut layers = Vec::new();
                let input = Encoded {
                    ids: ids.to_vec(),
                    type_ids: vec![0; ids.len()],
                };
                let (last, _, _) = run_bundle(
                    bundle,
                    runner.as_ref(),
                    index,
                    &input,
                    bucket,
                    Some(&mut layers),
                )?;
                layers.push(last);
                Ok((Some(bucket), layers))
            }
        }
    }
}

/// Runs one input in `bucket`; returns the last hidden state rows, the hidden size and the
/// package's `logits` (bundles with the head in the package). With `layers`, also collects the
/// embedding norm and every intermediate layer output.
fn run_bundle(
    bundle: &EncoderBundle,
    runner: &dyn BucketRunner,
    index: usize,
    input: &Encoded,
    bucket: usize,
    layers: Option<&mut Vec<Vec<f32>>>,
) -> Result<(Vec<f32>, usize, Option<Vec<f32>>)> {
    let config = &bundle.manifest.config;
    let h = config.hidden_size;
    let ids = &input.ids;
    let embedded = bundle.embed_raw(index, ids, Some(&input.type_ids))?;
    let (x, mask) = host_inputs(config, &embedded, ids.len(), bucket);
    let precision = runner.precision();
    let make = |shape: Vec<usize>, data: Vec<f32>| match precision {
        ExecPrecision::Fp16 => Tensor::f16(shape, data),
        ExecPrecision::Fp32 => Tensor::f32(shape, data),
    };
    let dtype_of = |name: &str| {
        bundle
            .manifest
            .package
            .functions
            .iter()
            .find(|f| f.name == names::function(bucket))
            .and_then(|f| f.inputs.iter().find(|i| i.name == name))
            .map(|i| i.dtype)
    };
    let tensor = |name: &str, shape: Vec<usize>, data: Vec<f32>| -> Result<Tensor> {
        Ok(match dtype_of(name) {
            Some(anemone_mil::DType::F32) => Tensor::f32(shape, data)?,
            Some(_) | None => make(shape, data)?,
        })
    };
    let mut inputs = HashMap::new();
    inputs.insert(
        names::EMBEDDINGS.to_string(),
        tensor(names::EMBEDDINGS, vec![1, h, 1, bucket], x)?,
    );
    inputs.insert(
        names::MASK.to_string(),
        tensor(names::MASK, vec![1, 1, 1, bucket], mask)?,
    );
    let function = names::function(bucket);
    let outputs = match layers {
        None => runner.predict(&function, &inputs)?,
        Some(layers) => {
            let wanted = names::observed(config);
            let mut observer = |o: OpOutput<'_>| {
                if wanted.iter().any(|w| w == o.value) {
                    layers.push(hidden_rows(h, bucket, ids.len(), &o.tensor.data));
                }
            };
            runner.predict_observed(&function, &inputs, &mut observer)?
        }
    };
    let out = outputs
        .get(names::HIDDEN_OUT)
        .ok_or_else(|| EncoderRunError::Output {
            path: bundle.package_path(),
            output: names::HIDDEN_OUT.into(),
        })?;
    let logits = outputs.get(names::LOGITS).map(|l| l.data.to_vec());
    Ok((hidden_rows(h, bucket, ids.len(), &out.data), h, logits))
}

/// What `classify` reports per label: the softmax of the logits, or for a single-logit head (a
/// reranker / cross-encoder score) its sigmoid, as sentence-transformers' `CrossEncoder` does.
pub fn probabilities(logits: &[f32]) -> Vec<f32> {
    match logits {
        [one] => vec![(1.0 / (1.0 + (-(*one as f64)).exp())) as f32],
        _ => softmax(logits),
    }
}

/// Softmax in f64.
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let exps: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| (e / sum) as f32).collect()
}
