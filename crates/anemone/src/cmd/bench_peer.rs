//! `anemone bench --llama-cpp`: llama.cpp (through llama-cpp-python) as a peer measured in the
//! same run, round by round with anemone, teacher-forced along anemone's greedy path so both
//! engines do the same work. The peer is `tools/llama_cpp_peer.py`, embedded in the binary and
//! run by the Python given with `--python`; it writes the GGUF it runs (dequantized to F16/F32
//! or quantized by llama.cpp to Q8_0/Q4_0) into a temporary directory removed afterwards.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anemone_runtime::engine::TimedRun;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The peer program (also imported by `benches/exec_vs_llamacpp.py`).
const PEER_SCRIPT: &str = include_str!("../../../../tools/llama_cpp_peer.py");

/// The GGUF llama.cpp runs, made from the source GGUF.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GgufType {
    F16,
    F32,
    #[value(name = "q8_0")]
    Q8_0,
    #[value(name = "q4_0")]
    Q4_0,
    /// The source GGUF unchanged.
    AsIs,
}

impl GgufType {
    fn name(self) -> &'static str {
        match self {
            GgufType::F16 => "F16",
            GgufType::F32 => "F32",
            GgufType::Q8_0 => "Q8_0",
            GgufType::Q4_0 => "Q4_0",
            GgufType::AsIs => "as-is",
        }
    }
}

/// A running peer: one llama.cpp model loaded, answering timed runs.
pub struct LlamaCppPeer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// e.g. `llama.cpp F16`
    pub label: String,
    /// What the peer reported when ready (GGUF path, preparation and load seconds, version).
    pub ready: Value,
    /// The peer process's peak resident memory, as of its last run.
    pub peak_rss_bytes: Option<u64>,
    /// Holds the GGUF written for the peer; removed on drop.
    _workdir: tempfile::TempDir,
}

impl LlamaCppPeer {
    /// Starts the peer on `src` made into `ty`, with `threads` threads and room for `context`
    /// tokens; returns once the model is loaded.
    pub fn start(
        python: &Path,
        src: &Path,
        ty: GgufType,
        threads: usize,
        context: usize,
    ) -> Result<Self> {
        let workdir = tempfile::Builder::new()
            .prefix("anemone-bench-llama-cpp-")
            .tempdir()
            .context("making a temporary directory for the peer's GGUF")?;
        let mut child = Command::new(python)
            .arg("-c")
            .arg(PEER_SCRIPT)
            .arg("serve")
            .arg("--src")
            .arg(src)
            .arg("--type")
            .arg(ty.name())
            .arg("--workdir")
            .arg(workdir.path())
            .arg("--threads")
            .arg(threads.to_string())
            .arg("--context")
            .arg(context.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the llama.cpp peer with {}", python.display()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            bail!("the llama.cpp peer's pipes are missing");
        };
        let mut peer = LlamaCppPeer {
            child,
            stdin,
            stdout: BufReader::new(stdout),
            label: format!("llama.cpp {}", ty.name()),
            ready: Value::Null,
            peak_rss_bytes: None,
            _workdir: workdir,
        };
        let ready = peer
            .reply()
            .with_context(|| format!("llama.cpp peer on {} ({})", src.display(), ty.name()))?;
        peer.ready = ready;
        Ok(peer)
    }

    /// One JSON line from the peer; its `error` as an error.
    fn reply(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line)?;
        if n == 0 {
            let status = self.child.wait()?;
            bail!("the llama.cpp peer exited ({status}); its error is above");
        }
        let value: Value = serde_json::from_str(&line)
            .with_context(|| format!("the llama.cpp peer answered {line:?}"))?;
        if let Some(e) = value.get("error").and_then(Value::as_str) {
            bail!("{e}");
        }
        Ok(value)
    }

    /// Evaluates `prompt`, then each of `forced` alone, timing every step.
    pub fn timed(&mut self, prompt: &[u32], forced: &[u32]) -> Result<TimedRun> {
        let request = json!({"prompt": prompt, "forced": forced});
        writeln!(self.stdin, "{request}")?;
        self.stdin.flush()?;
        let reply = self.reply()?;
        self.peak_rss_bytes = reply["peak_rss_bytes"].as_u64();
        let prefill_s = reply["prefill_s"]
            .as_f64()
            .context("the llama.cpp peer's reply has no prefill_s")?;
        let token_s = reply["token_s"]
            .as_array()
            .context("the llama.cpp peer's reply has no token_s")?
            .iter()
            .map(|v| v.as_f64().context("a token time is not a number"))
            .collect::<Result<Vec<f64>>>()?;
        Ok(TimedRun {
            prompt_tokens: prompt.len(),
            prefill_s,
            token_s,
            fed: forced.to_vec(),
        })
    }
}

impl Drop for LlamaCppPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python to run the peer with: `--python`, else `ANEMONE_PYTHON`, else `python3`.
pub fn python(given: Option<&PathBuf>) -> PathBuf {
    given
        .cloned()
        .or_else(|| std::env::var_os("ANEMONE_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python3"))
}
