//! `anemone embed` and `anemone classify`: encoder outputs from a checkpoint (fp32 reference) or
//! an encoder bundle (the executor), one per input, grouped by length bucket.

use std::path::PathBuf;

use anemone_mil::Precision;
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

    fn run(&self) -> Result<(Encoder, Vec<String>, Vec<Embedded>)> {
        let texts = self.texts()?;
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
        let choice = self.coreml.choice(kind, self.precision, self.threads);
        let encoder = Encoder::open_on(&self.model, &choice)
            .with_context(|| format!("opening {}", self.model.display()))?;
        let ids = encoder.tokenize(&texts)?;
        let results = encoder.embed_ids(&ids)?;
        Ok((encoder, texts, results))
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
    let (encoder, texts, results) = args.input.run()?;
    let pooling = encoder.pooling();
    if args.input.json {
        let report = serde_json::json!({
            "model": args.input.model,
            "engine": encoder.description,
            "pooling": pooling.mode.name(),
            "normalize": pooling.normalize,
            "inputs": results.iter().map(|r| serde_json::json!({
                "id": r.index,
                "text": texts[r.index],
                "tokens": r.tokens,
                "bucket": r.bucket,
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

/// Labels and probabilities of a sequence-classification encoder (`id2label`).
///
/// Examples:
///   anemone classify models/my-classifier --text "great movie" --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ClassifyArgs {
    #[command(flatten)]
    pub input: EncoderInputArgs,
}

pub fn run_classify(args: ClassifyArgs) -> Result<()> {
    let (encoder, texts, results) = args.input.run()?;
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
            "inputs": rows.iter().map(|(r, logits, probs, best)| serde_json::json!({
                "id": r.index, "text": texts[r.index], "tokens": r.tokens, "bucket": r.bucket,
                "label": labels[*best], "logits": logits, "probabilities": probs,
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
