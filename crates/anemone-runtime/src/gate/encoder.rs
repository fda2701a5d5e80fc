//! The encoder gate: an encoder bundle, run by the executor, against the fp32 reference on
//! built-in sentences of many lengths and languages (or a user file): embedding cosine per
//! input, per-layer hidden-state cosine (where agreement drops), classification decisions and
//! the largest probability error for models with a head.

use std::path::Path;

use serde::Serialize;

use crate::encoder::{Encoder, EncoderRunError};

/// Built-in gate sentences: short to long (several buckets), eight scripts/languages, digits,
/// punctuation and code.
pub fn default_sentences() -> Vec<String> {
    let mut s: Vec<String> = [
        "hi",
        "Paris is the capital of France.",
        "The quick brown fox jumps over the lazy dog.",
        "Le chat dort sur le canapé pendant que la pluie tombe.",
        "Der Zug nach Berlin fährt um acht Uhr ab, aber heute hat er Verspätung.",
        "El médico recomendó descansar y beber mucha agua durante tres días.",
        "東京は日本の首都で、世界で最も人口の多い都市圏の一つです。",
        "Москва — столица России и крупнейший город страны.",
        "مرحبا بكم في المؤتمر الدولي للذكاء الاصطناعي",
        "fn main() { println!(\"{}\", 2 + 2); } // prints 4",
        "Order #48213 shipped on 2024-03-17 at 09:45 UTC; total $1,299.99.",
        "What is the boiling point of water at sea level, and why does it change at altitude?",
    ]
    .iter()
    .map(|t| t.to_string())
    .collect();
    s.push(
        "Rust's ownership rules make data races a compile-time error rather than a runtime \
         surprise, which is why many systems programmers reach for it when correctness under \
         concurrency matters more than a quick prototype."
            .into(),
    );
    let paragraph = "Sentence embeddings turn text into fixed-size vectors so that similar \
         meanings land close together; search engines, recommendation systems and clustering \
         pipelines compare those vectors with a cosine instead of matching words. ";
    s.push(paragraph.repeat(3).trim_end().to_string());
    s.push(paragraph.repeat(8).trim_end().to_string());
    s
}

/// Reads one input per line (UTF-8; an invalid line is an error naming it; blank lines are
/// errors too, as empty inputs are).
pub fn read_lines(path: &Path) -> Result<Vec<String>, LinesError> {
    let bytes = std::fs::read(path).map_err(|source| LinesError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
        .into_iter()
        .enumerate()
        .map(|(i, raw)| {
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            let text = std::str::from_utf8(raw).map_err(|e| LinesError::Utf8 {
                path: path.to_path_buf(),
                line: i + 1,
                detail: e.to_string(),
            })?;
            if text.trim().is_empty() {
                return Err(LinesError::Empty {
                    path: path.to_path_buf(),
                    line: i + 1,
                });
            }
            Ok(text.to_string())
        })
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum LinesError {
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: line {line} is not valid UTF-8 ({detail})", path.display())]
    Utf8 {
        path: std::path::PathBuf,
        line: usize,
        detail: String,
    },
    #[error("{}: line {line} is empty (empty inputs are refused)", path.display())]
    Empty {
        path: std::path::PathBuf,
        line: usize,
    },
}

/// One input's agreement.
#[derive(Debug, Clone, Serialize)]
pub struct EncoderInputReport {
    pub index: usize,
    pub tokens: usize,
    pub bucket: Option<usize>,
    pub embedding_cosine: f64,
    pub embedding_max_abs_error: f32,
    /// Cosine of the hidden states (all tokens) after the embeddings (0) and each layer.
    pub layer_cosine: Vec<f64>,
    pub decision_equal: Option<bool>,
    pub max_probability_error: Option<f32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EncoderGateReport {
    pub bundle: String,
    pub engine: String,
    pub inputs: Vec<EncoderInputReport>,
    pub min_embedding_cosine: f64,
    /// Worst cosine per depth over all inputs.
    pub min_layer_cosine: Vec<f64>,
    pub decisions_equal: Option<usize>,
    pub max_probability_error: Option<f32>,
    pub threshold: f64,
    pub passed: bool,
    /// Why it failed (input and value), empty on a pass.
    pub failures: Vec<String>,
}

/// Gates `bundle` against `reference` on `texts`.
pub fn gate_encoder(
    bundle_name: &str,
    bundle: &Encoder,
    reference: &Encoder,
    texts: &[String],
    min_embedding_cosine: f64,
) -> Result<EncoderGateReport, EncoderRunError> {
    let ids = reference.tokenize(texts)?;
    let want = reference.embed_ids(&ids)?;
    let got = bundle.embed_ids(&ids)?;
    let mut inputs = Vec::new();
    let mut failures = Vec::new();
    for (g, w) in got.iter().zip(&want) {
        let (_, layers) = bundle.hidden_states(g.index, &ids[g.index])?;
        let (_, ref_layers) = reference.hidden_states(g.index, &ids[g.index])?;
        let layer_cosine: Vec<f64> = layers
            .iter()
            .zip(&ref_layers)
            .map(|(a, b)| cosine(a, b))
            .collect();
        let embedding_cosine = cosine(&g.embedding, &w.embedding);
        let max_err = g
            .embedding
            .iter()
            .zip(&w.embedding)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let (decision_equal, max_probability_error) = match (&g.probabilities, &w.probabilities) {
            (Some(gp), Some(wp)) => (
                Some(argmax(gp) == argmax(wp)),
                Some(
                    gp.iter()
                        .zip(wp)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max),
                ),
            ),
            _ => (None, None),
        };
        if embedding_cosine.is_nan() || embedding_cosine < min_embedding_cosine {
            failures.push(format!(
                "input {} ({} tokens): embedding cosine {embedding_cosine:.7} < {min_embedding_cosine}",
                g.index, g.tokens
            ));
        }
        if decision_equal == Some(false) {
            failures.push(format!(
                "input {}: classification decision differs",
                g.index
            ));
        }
        inputs.push(EncoderInputReport {
            index: g.index,
            tokens: g.tokens,
            bucket: g.bucket,
            embedding_cosine,
            embedding_max_abs_error: max_err,
            layer_cosine,
            decision_equal,
            max_probability_error,
        });
    }
    let depth = inputs
        .iter()
        .map(|i| i.layer_cosine.len())
        .max()
        .unwrap_or(0);
    let min_layer_cosine = (0..depth)
        .map(|d| {
            inputs
                .iter()
                .filter_map(|i| i.layer_cosine.get(d).copied())
                .fold(1.0, f64::min)
        })
        .collect();
    let decisions: Vec<bool> = inputs.iter().filter_map(|i| i.decision_equal).collect();
    Ok(EncoderGateReport {
        bundle: bundle_name.to_string(),
        engine: bundle.description.clone(),
        min_embedding_cosine: inputs
            .iter()
            .map(|i| i.embedding_cosine)
            .fold(1.0, f64::min),
        min_layer_cosine,
        decisions_equal: (!decisions.is_empty()).then(|| decisions.iter().filter(|&&d| d).count()),
        max_probability_error: inputs
            .iter()
            .filter_map(|i| i.max_probability_error)
            .reduce(f32::max),
        threshold: min_embedding_cosine,
        passed: failures.is_empty(),
        failures,
        inputs,
    })
}

fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .unwrap_or(0)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        ab += *x as f64 * *y as f64;
        aa += *x as f64 * *x as f64;
        bb += *y as f64 * *y as f64;
    }
    if aa == 0.0 && bb == 0.0 {
        1.0
    } else {
        ab / (aa.sqrt() * bb.sqrt())
    }
}
