//! Measures package write and read throughput on a Qwen3-0.6B-block-sized program
//! (15.7M fp16 weights in 7 projections, decode + prefill functions sharing them).
//!
//! `cargo run -p anemone-mil --example package_throughput [--release] -- [DIR]`

use std::time::Instant;

use anemone_mil::{
    DType, FunctionBuilder, Program, SpecVersion, TensorData, TensorType, WriteOptions,
};

const HIDDEN: usize = 1024;
const Q: usize = 2048;
const KV: usize = 1024;
const FF: usize = 3072;

fn weights() -> Vec<(&'static str, TensorData)> {
    let mut seed = 1u32;
    let mut w = |o: usize, i: usize| {
        let v: Vec<f32> = (0..o * i)
            .map(|_| {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect();
        TensorData::f16_from_f32(vec![o, i, 1, 1], &v).expect("sized")
    };
    vec![
        ("q_proj", w(Q, HIDDEN)),
        ("k_proj", w(KV, HIDDEN)),
        ("v_proj", w(KV, HIDDEN)),
        ("o_proj", w(HIDDEN, Q)),
        ("gate_proj", w(FF, HIDDEN)),
        ("up_proj", w(FF, HIDDEN)),
        ("down_proj", w(HIDDEN, FF)),
    ]
}

fn function(name: &str, t: usize, ws: &[(&str, TensorData)]) -> anemone_mil::Function {
    let mut f = FunctionBuilder::new(name);
    let x = f
        .input("x", TensorType::new(DType::F16, [1, HIDDEN, 1, t]))
        .expect("input");
    let mut outs = Vec::new();
    for (n, data) in ws {
        let w = f
            .constant(&format!("{n}_weight"), data.clone())
            .expect("const");
        let input_c = data.shape()[1];
        let src = if input_c == HIDDEN {
            x
        } else {
            f.concat(&format!("{n}_in"), &vec![x; input_c / HIDDEN], 1)
                .expect("concat")
        };
        let y = f.conv1x1(n, src, w, None).expect("conv");
        let r = f
            .reduce_sum(&format!("{n}_sum"), y, &[1], true)
            .expect("reduce");
        outs.push(r);
    }
    let mut acc = outs[0];
    for (i, o) in outs.iter().enumerate().skip(1) {
        acc = f.add(&format!("acc{i}"), acc, *o).expect("add");
    }
    f.output(acc).expect("output");
    f.finish().expect("verify")
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join("throughput.mlpackage");
    let t0 = Instant::now();
    let ws = weights();
    let params: usize = ws.iter().map(|(_, d)| d.numel()).sum();
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(function("decode", 1, &ws)).expect("add");
    p.add_function(function("prefill", 64, &ws)).expect("add");
    let built = t0.elapsed();
    let t1 = Instant::now();
    let s =
        anemone_mil::write_package(&p, &path, &WriteOptions { overwrite: true }).expect("write");
    let wrote = t1.elapsed();
    let t2 = Instant::now();
    let back = anemone_mil::read_package(&path).expect("read");
    let read = t2.elapsed();
    assert!(back == p, "read-back differs");
    let mb = s.weight_bytes as f64 / 1e6;
    println!(
        "{params} params, weight.bin {mb:.1} MB ({} blobs), model.mlmodel {} bytes\n\
         build {:.2}s, write {:.2}s ({:.0} MB/s), read {:.2}s ({:.0} MB/s)",
        s.blob_count,
        s.model_bytes,
        built.as_secs_f64(),
        wrote.as_secs_f64(),
        mb / wrote.as_secs_f64(),
        read.as_secs_f64(),
        mb / read.as_secs_f64()
    );
    std::fs::remove_dir_all(&path).expect("cleanup");
}
