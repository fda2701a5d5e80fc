//! `anemone embed` and `anemone classify`: encoder outputs from a checkpoint (fp32 reference) or
//! an encoder bundle (the executor), one per input, grouped by length bucket.

use std::path::PathBuf;

use anemone_mil::Precision;
use anemone_models::encoder::Encoded;
use anemone_runtime::backend::BackendKind;
use anemone_runtime::encoder::{Embedded, Encoder};
use anemone_runtime::gate::encoder::read_lines;
use anyhow::{bail, Context, Result};
use clap::Args;

/// Inputs and model shared by `embed` and `classify`.
#[derive(Debug, Args)]
pub struct EncoderInputArgs {
    /// A Hugging Face encoder directory (runs the fp32 reference) or an encoder bundle (runs on
    /// --backend).
    pub model: PathBuf,

    /// An input text (repeat for several).
    #[arg(long, conflicts_with = "file")]
    pub text: Vec<String>,

    /// A UTF-8 file with one input per line.
    #[arg(long)]
    pub file: Option<PathBuf>,

    /// Pairs are read instead of single texts (`classify --pair` / `--pairs-file`).
    #[arg(skip)]
    pub pairs: Vec<(String, String)>,

    /// Executor precision for bundles.
    #[arg(long, default_value = "fp16")]
    pub precision: Precision,

    /// Bundles only: the engine that runs the package (default: Core ML on Apple systems, the
    /// executor elsewhere).
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<BackendKind>,
    #[command(flatten)]
    pub coreml: super::CoreMlArgs,

    /// Bundles only: threads per forward pass (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,

    /// Measurement: run all inputs this many times untimed first (warm caches), then report
    /// load time, total run time and per-input latency (`--json`: `timing`, `latency_ms`).
    #[arg(long, default_value_t = 0)]
    pub warmup: usize,
}

/// Load and run wall times of one `embed`/`classify` call.
pub struct Timing {
    pub load_seconds: f64,
    pub run_seconds: f64,
}

impl Timing {
    fn json(&self, warmup: usize) -> serde_json::Value {
        serde_json::json!({
            "load_ms": self.load_seconds * 1e3,
            "run_ms": self.run_seconds * 1e3,
            "warmup_runs": warmup,
        })
    }
}

impl EncoderInputArgs {
    fn texts(&self) -> Result<Vec<String>> {
        let texts = match &self.file {
            Some(path) => read_lines(path)?,
            None => self.text.clone(),
        };
        if texts.is_empty() {
            bail!("no input: pass --text T (repeatable) or --file F");
        }
        Ok(texts)
    }

    fn run(&self) -> Result<(Encoder, Vec<String>, Vec<Embedded>, Timing)> {
        let texts = if self.pairs.is_empty() {
            self.texts()?
        } else {
            self.pairs
                .iter()
                .map(|(a, b)| format!("{a}\t{b}"))
                .collect()
        };
        let is_bundle = self
            .model
            .join(anemone_models::bundle::MANIFEST_FILE)
            .is_file();
        if !is_bundle && self.backend.is_some() {
            bail!(
                "--backend applies to bundles; {} is a checkpoint (runs the fp32 reference)",
                self.model.display()
            );
        }
        let kind = self.backend.unwrap_or_else(BackendKind::for_bundles);
        let choice = self
            .coreml
            .choice(kind, self.precision.into(), self.threads);
        let started = std::time::Instant::now();
        let encoder = Encoder::open_on(&self.model, &choice)
            .with_context(|| format!("opening {}", self.model.display()))?;
        let load_seconds = started.elapsed().as_secs_f64();
        let encoded = if self.pairs.is_empty() {
            let ids = encoder.tokenize(&texts)?;
            ids.into_iter()
                .map(|ids| Encoded {
                    type_ids: vec![0; ids.len()],
                    ids,
                })
                .collect()
        } else {
            encoder.tokenize_pairs(&self.pairs)?
        };
        for _ in 0..self.warmup {
            encoder.embed_encoded(&encoded)?;
        }
        let started = std::time::Instant::now();
        let results = encoder.embed_encoded(&encoded)?;
        let timing = Timing {
            load_seconds,
            run_seconds: started.elapsed().as_secs_f64(),
        };
        tracing::info!(
            load_ms = timing.load_seconds * 1e3,
            run_ms = timing.run_seconds * 1e3,
            inputs = results.len(),
            "encoder run"
        );
        Ok((encoder, texts, results, timing))
    }
}

/// One embedding per input, pooled and normalised as the model's sentence-transformers config
/// says.
///
/// Examples:
///   anemone embed models/all-minilm-l6-v2 --text "Paris is the capital of France."
///   anemone embed minilm.bundle --file sentences.txt --json > embeddings.json
///   anemone embed minilm.bundle --backend executor --threads 2 --text "hello"
///
/// Each input runs in the smallest length bucket of the bundle that holds it; an input longer
/// than the largest bucket is an error naming both lengths (never truncated). Empty or
/// whitespace-only inputs are refused.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub input: EncoderInputArgs,
}

pub fn run_embed(args: EmbedArgs) -> Result<()> {
    let (encoder, texts, results, timing) = args.input.run()?;
    let pooling = encoder.pooling();
    if args.input.json {
        let report = serde_json::json!({
            "model": args.input.model,
            "engine": encoder.description,
            "pooling": pooling.mode.name(),
            "normalize": pooling.normalize,
            "timing": timing.json(args.input.warmup),
            "inputs": results.iter().map(|r| serde_json::json!({
                "id": r.index,
                "text": texts[r.index],
                "tokens": r.tokens,
                "bucket": r.bucket,
                "latency_ms": r.seconds * 1e3,
                "embedding": r.embedding,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} ({}; pooling {}{})",
            args.input.model.display(),
            encoder.description,
            pooling.mode.name(),
            if pooling.normalize {
                ", normalised"
            } else {
                ""
            }
        );
        for r in &results {
            let head: Vec<String> = r
                .embedding
                .iter()
                .take(6)
                .map(|v| format!("{v:+.5}"))
                .collect();
            let bucket = r.bucket.map(|b| format!(" bucket {b}")).unwrap_or_default();
            println!(
                "{:>3}  {:>4} tokens{bucket}  dim {}  [{} …]",
                r.index,
                r.tokens,
                r.embedding.len(),
                head.join(", ")
            );
        }
    }
    Ok(())
}

/// Labels and probabilities of a sequence-classification encoder (`id2label`), on texts or on
/// text pairs (cross-encoders / rerankers).
///
/// Examples:
///   anemone classify models/my-classifier --text "great movie" --json
///   anemone classify models/my-reranker --pair "what is rust" "Rust is a language" --json
///   anemone classify models/my-reranker --pairs-file pairs.tsv
///
/// A pair is tokenized with the tokenizer's pair template (BERT: `[CLS] A [SEP] B [SEP]`,
/// token type 1 from B on). A single-logit head reports its sigmoid as the score (as
/// sentence-transformers' CrossEncoder does); several logits report their softmax.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ClassifyArgs {
    #[command(flatten)]
    pub input: EncoderInputArgs,

    /// A text pair A B (repeat for several); replaces --text / --file.
    #[arg(long, num_args = 2, value_names = ["A", "B"], action = clap::ArgAction::Append,
          conflicts_with_all = ["text", "file", "pairs_file"])]
    pub pair: Vec<String>,

    /// A UTF-8 file with one pair per line, the two texts separated by a tab.
    #[arg(long, conflicts_with_all = ["text", "file"])]
    pub pairs_file: Option<PathBuf>,
}

/// `--pair` values (A B A B …) or the lines of `--pairs-file` (`A<TAB>B`) as pairs.
fn read_pairs(args: &ClassifyArgs) -> Result<Vec<(String, String)>> {
    if let Some(path) = &args.pairs_file {
        let lines = read_lines(path)?;
        let mut pairs = Vec::with_capacity(lines.len());
        for (i, line) in lines.iter().enumerate() {
            let Some((a, b)) = line.split_once('\t') else {
                bail!(
                    "{}: line {}: no tab between the two texts of a pair",
                    path.display(),
                    i + 1
                );
            };
            if b.contains('\t') {
                bail!(
                    "{}: line {}: more than one tab (a pair is two texts)",
                    path.display(),
                    i + 1
                );
            }
            pairs.push((a.to_string(), b.to_string()));
        }
        if pairs.is_empty() {
            bail!("{}: no pairs", path.display());
        }
        return Ok(pairs);
    }
    Ok(args
        .pair
        .chunks_exact(2)
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect())
}

pub fn run_classify(mut args: ClassifyArgs) -> Result<()> {
    args.input.pairs = read_pairs(&args)?;
    let (encoder, texts, results, timing) = args.input.run()?;
    let labels = encoder.labels().to_vec();
    if labels.is_empty() {
        bail!(
            "{} has no classification head (no *ForSequenceClassification / id2label); use `anemone embed`",
            args.input.model.display()
        );
    }
    let mut rows = Vec::new();
    for r in &results {
        let (Some(logits), Some(probs)) = (&r.logits, &r.probabilities) else {
            bail!("input {}: the model produced no logits", r.index);
        };
        let best = probs
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .unwrap_or(0);
        rows.push((r, logits, probs, best));
    }
    if args.input.json {
        let report = serde_json::json!({
            "model": args.input.model,
            "engine": encoder.description,
            "labels": labels,
            "timing": timing.json(args.input.warmup),
            "inputs": rows.iter().map(|(r, logits, probs, best)| serde_json::json!({
                "id": r.index, "text": texts[r.index], "tokens": r.tokens, "bucket": r.bucket,
                "label": labels[*best], "logits": logits, "probabilities": probs,
                "latency_ms": r.seconds * 1e3,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for (r, _, probs, best) in rows {
            let scores: Vec<String> = labels
                .iter()
                .zip(probs.iter())
                .map(|(l, p)| format!("{l} {p:.4}"))
                .collect();
            println!(
                "{:>3}  {:<12} ({})",
                r.index,
                labels[best],
                scores.join(", ")
            );
        }
    }
    Ok(())
}
