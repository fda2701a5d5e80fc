//! A GGUF writer for tests, written from the format description (independent of the reader), and
//! tiny synthetic decoder checkpoints built with it.

#![allow(dead_code)]

use half::f16;
use std::collections::HashMap;

pub enum Val {
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
}

impl Val {
    fn type_id(&self) -> u32 {
        match self {
            Val::U32(_) => 4,
            Val::I32(_) => 5,
            Val::F32(_) => 6,
            Val::Bool(_) => 7,
            Val::Str(_) => 8,
            Val::StrArr(_) | Val::I32Arr(_) => 9,
        }
    }
}

pub struct Tensor {
    pub name: String,
    /// ggml `ne` (innermost first).
    pub ne: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// Where things landed in the written bytes, so tests can corrupt them precisely.
#[derive(Default, Debug)]
pub struct Layout {
    /// Position of each metadata key's u64 length prefix.
    pub key_len_at: HashMap<String, usize>,
    /// Position of each metadata value (for arrays: the u32 element type).
    pub value_at: HashMap<String, usize>,
    /// Position of each tensor info's u64 offset field.
    pub tensor_offset_at: HashMap<String, usize>,
    /// Position of each tensor info's u32 type field.
    pub tensor_type_at: HashMap<String, usize>,
    pub infos_end: usize,
    pub data_start: usize,
}

pub struct GgufWriter {
    pub version: u32,
    pub alignment: usize,
    pub kvs: Vec<(String, Val)>,
    pub tensors: Vec<Tensor>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl GgufWriter {
    pub fn new() -> Self {
        Self {
            version: 3,
            alignment: 32,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    pub fn kv(&mut self, key: &str, v: Val) -> &mut Self {
        self.kvs.retain(|(k, _)| k != key);
        self.kvs.push((key.to_string(), v));
        self
    }

    pub fn remove_kv(&mut self, key: &str) -> &mut Self {
        self.kvs.retain(|(k, _)| k != key);
        self
    }

    pub fn tensor_f32(&mut self, name: &str, hf_shape: &[usize], data: &[f32]) -> &mut Self {
        assert_eq!(hf_shape.iter().product::<usize>(), data.len());
        self.tensors.push(Tensor {
            name: name.into(),
            ne: hf_shape.iter().rev().map(|&d| d as u64).collect(),
            type_id: 0,
            data: data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        });
        self
    }

    pub fn tensor_f16(&mut self, name: &str, hf_shape: &[usize], data: &[f32]) -> &mut Self {
        self.tensors.push(Tensor {
            name: name.into(),
            ne: hf_shape.iter().rev().map(|&d| d as u64).collect(),
            type_id: 1,
            data: data
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
        });
        self
    }

    /// Q8_0 with every block's scale 1/64 (values must be multiples of 1/64 in [-2, 2) to
    /// round-trip exactly).
    pub fn tensor_q8_0(&mut self, name: &str, hf_shape: &[usize], data: &[f32]) -> &mut Self {
        let mut bytes = Vec::new();
        for block in data.chunks(32) {
            bytes.extend(f16::from_f32(1.0 / 64.0).to_le_bytes());
            bytes.extend(block.iter().map(|&x| ((x * 64.0).round() as i8) as u8));
        }
        self.tensors.push(Tensor {
            name: name.into(),
            ne: hf_shape.iter().rev().map(|&d| d as u64).collect(),
            type_id: 8,
            data: bytes,
        });
        self
    }

    pub fn remove_tensor(&mut self, name: &str) -> &mut Self {
        self.tensors.retain(|t| t.name != name);
        self
    }

    pub fn write(&self) -> (Vec<u8>, Layout) {
        let mut out = Vec::new();
        let mut layout = Layout::default();
        out.extend(b"GGUF");
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (key, v) in &self.kvs {
            layout.key_len_at.insert(key.clone(), out.len());
            put_str(&mut out, key);
            out.extend(v.type_id().to_le_bytes());
            layout.value_at.insert(key.clone(), out.len());
            match v {
                Val::U32(x) => out.extend(x.to_le_bytes()),
                Val::I32(x) => out.extend(x.to_le_bytes()),
                Val::F32(x) => out.extend(x.to_le_bytes()),
                Val::Bool(b) => out.push(*b as u8),
                Val::Str(s) => put_str(&mut out, s),
                Val::StrArr(items) => {
                    out.extend(8u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for s in items {
                        put_str(&mut out, s);
                    }
                }
                Val::I32Arr(items) => {
                    out.extend(5u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    for x in items {
                        out.extend(x.to_le_bytes());
                    }
                }
            }
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend(d.to_le_bytes());
            }
            layout.tensor_type_at.insert(t.name.clone(), out.len());
            out.extend(t.type_id.to_le_bytes());
            layout.tensor_offset_at.insert(t.name.clone(), out.len());
            out.extend((offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).next_multiple_of(self.alignment);
        }
        layout.infos_end = out.len();
        out.resize(out.len().next_multiple_of(self.alignment), 0);
        layout.data_start = out.len();
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(layout.data_start + off, 0);
            out.extend(&t.data);
        }
        (out, layout)
    }
}

/// llama.cpp's `permute` (convert_hf_to_gguf.py): HF rows viewed as `[n, 2, rows/n/2, cols]`,
/// axes 1 and 2 swapped.
pub fn llama_cpp_permute(w: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
    let half = rows / n / 2;
    let mut out = Vec::with_capacity(w.len());
    for a in 0..n {
        for b in 0..half {
            for c in 0..2 {
                let src = (a * 2 + c) * half + b;
                out.extend_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// Shape of the tiny decoder: hidden 32 (one Q8_0 block per row), 4 query heads and 2 KV heads
/// of size 8, MLP 64, vocabulary 40, 2 layers.
pub const HIDDEN: usize = 32;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 8;
pub const FFN: usize = 64;
pub const VOCAB: usize = 40;
pub const LAYERS: usize = 2;

/// Distinct, exactly representable (in f16 and Q8_0) values for tensor `seed`.
pub fn values(seed: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + seed * 13) % 251) as f32 - 125.0) / 64.0)
        .collect()
}

/// A tiny llama-architecture GGUF, tensors as llama.cpp writes them (q/k rows permuted).
/// Returns the writer (to be altered by tests) and the Hugging Face q/k weights of layer 0.
pub fn tiny_llama() -> (GgufWriter, Vec<f32>, Vec<f32>) {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama".into()))
        .kv("general.alignment", Val::U32(32))
        .kv("llama.embedding_length", Val::U32(HIDDEN as u32))
        .kv("llama.block_count", Val::U32(LAYERS as u32))
        .kv("llama.feed_forward_length", Val::U32(FFN as u32))
        .kv("llama.attention.head_count", Val::U32(HEADS as u32))
        .kv("llama.attention.head_count_kv", Val::U32(KV_HEADS as u32))
        .kv("llama.rope.freq_base", Val::F32(50000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Val::F32(1e-5))
        .kv("llama.context_length", Val::U32(256))
        .kv("llama.vocab_size", Val::U32(VOCAB as u32))
        .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(2));
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    w.tensor_f32(
        "token_embd.weight",
        &[VOCAB, HIDDEN],
        &values(1, VOCAB * HIDDEN),
    )
    .tensor_f32("output_norm.weight", &[HIDDEN], &values(2, HIDDEN));
    let (mut q0, mut k0) = (Vec::new(), Vec::new());
    for l in 0..LAYERS {
        let s = 10 * (l + 1);
        let q_hf = values(s, q * HIDDEN);
        let k_hf = values(s + 1, kv * HIDDEN);
        w.tensor_f32(
            &format!("blk.{l}.attn_q.weight"),
            &[q, HIDDEN],
            &llama_cpp_permute(&q_hf, q, HIDDEN, HEADS),
        )
        .tensor_f16(
            &format!("blk.{l}.attn_k.weight"),
            &[kv, HIDDEN],
            &llama_cpp_permute(&k_hf, kv, HIDDEN, KV_HEADS),
        )
        .tensor_q8_0(
            &format!("blk.{l}.attn_v.weight"),
            &[kv, HIDDEN],
            &values(s + 2, kv * HIDDEN),
        )
        .tensor_f32(
            &format!("blk.{l}.attn_output.weight"),
            &[HIDDEN, q],
            &values(s + 3, HIDDEN * q),
        )
        .tensor_f32(
            &format!("blk.{l}.ffn_gate.weight"),
            &[FFN, HIDDEN],
            &values(s + 4, FFN * HIDDEN),
        )
        .tensor_f32(
            &format!("blk.{l}.ffn_up.weight"),
            &[FFN, HIDDEN],
            &values(s + 5, FFN * HIDDEN),
        )
        .tensor_f32(
            &format!("blk.{l}.ffn_down.weight"),
            &[HIDDEN, FFN],
            &values(s + 6, HIDDEN * FFN),
        )
        .tensor_f32(
            &format!("blk.{l}.attn_norm.weight"),
            &[HIDDEN],
            &values(s + 7, HIDDEN),
        )
        .tensor_f32(
            &format!("blk.{l}.ffn_norm.weight"),
            &[HIDDEN],
            &values(s + 8, HIDDEN),
        );
        if l == 0 {
            (q0, k0) = (q_hf, k_hf);
        }
    }
    (w, q0, k0)
}

/// Writes `bytes` to a fresh temporary `.gguf` file.
pub fn write_temp(bytes: &[u8]) -> tempfile::TempPath {
    use std::io::Write;
    let mut f = tempfile::Builder::new().suffix(".gguf").tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.into_temp_path()
}
