//! Packages holding one compressed conv / linear per scheme pass coremltools' validator
//! (`validate_mlpackage.py --strict`), and coremltools' own `decompress` of every constexpr op
//! is bit-identical to ours. Needs python3 with coremltools; fails (never skips) without it.

mod common;

use std::path::Path;

use anemone_testkit::run_python;

use anemone_compress::{compress, emit_weight, Compressed, Scheme};
use anemone_mil::{
    write_package, DType, FunctionBuilder, Program, SpecVersion, TensorType, WriteOptions,
};
use common::Rng;

const SCHEMES: [&str; 16] = [
    "int8",
    "int4",
    "int8:grid",
    "int4:grid:block=16",
    "int8:block=16",
    "int4:block=24",
    "lut1",
    "lut2",
    "lut3",
    "lut4",
    "lut6",
    "lut8",
    "lut4:uniform",
    "lut8:uniform:group=16",
    "lut2:group=0",
    "lut6:group=64",
];

/// One function: for each scheme a 1×1 conv `[64, 48, 1, 1]` and a linear `[64, 48]`.
fn build() -> (Program, Vec<(String, Compressed)>) {
    let (o, i) = (64, 48);
    let mut rng = Rng::new(99);
    let mut f = FunctionBuilder::new("main");
    let x = f
        .input("x", TensorType::new(DType::F16, [1, i, 1, 8]))
        .unwrap();
    let xl = f.input("xl", TensorType::new(DType::F16, [8, i])).unwrap();
    let mut emitted = Vec::new();
    for (n, text) in SCHEMES.iter().enumerate() {
        let scheme: Scheme = text.parse().unwrap();
        let w = if text.contains("grid") {
            // a Q4_1-like source with 16-value blocks: stored on its grid, with fp16 offsets
            common::q4_1_like(&mut rng, o * i, 16, 0.001, 0.004)
        } else {
            rng.normals(o * i, 0.02)
        };
        let conv_w = compress("conv", &w, &[o, i, 1, 1], &scheme).unwrap();
        let wv = emit_weight(&mut f, &format!("conv{n}_weight"), &conv_w).unwrap();
        let y = f.conv1x1(&format!("conv{n}"), x, wv, None).unwrap();
        f.output(y).unwrap();
        let lin_w = compress("linear", &w, &[o, i], &scheme).unwrap();
        let lv = emit_weight(&mut f, &format!("linear{n}_weight"), &lin_w).unwrap();
        let z = f.linear(&format!("linear{n}"), xl, lv, None).unwrap();
        f.output(z).unwrap();
        emitted.push((format!("conv{n}_weight"), conv_w));
        emitted.push((format!("linear{n}_weight"), lin_w));
    }
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(f.finish().unwrap()).unwrap();
    (p, emitted)
}

#[test]
fn compressed_package_validates_and_decompresses_bit_identically_in_coremltools() {
    let (program, emitted) = build();
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("compressed.mlpackage");
    write_package(&program, &pkg, &WriteOptions::default()).unwrap();
    anemone_testkit::validate(&pkg);

    let values = dir.path().join("values");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/coremltools_decompress.py");
    let out = run_python(&[script.as_os_str(), pkg.as_os_str(), values.as_os_str()]);
    assert!(
        out.status.success(),
        "coremltools could not decompress:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (name, c) in &emitted {
        let bytes = std::fs::read(values.join(format!("{name}.f32")))
            .unwrap_or_else(|e| panic!("{name}: coremltools wrote no value ({e})"));
        let theirs: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let ours = c.decompress();
        assert_eq!(theirs.len(), ours.len(), "{name} ({})", c.scheme());
        if let Some(k) = (0..ours.len()).find(|&k| theirs[k].to_bits() != ours[k].to_bits()) {
            panic!(
                "{name} ({}): element {k}: coremltools {} vs ours {}",
                c.scheme(),
                theirs[k],
                ours[k]
            );
        }
    }
}
