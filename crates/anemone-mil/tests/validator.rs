//! Every package this crate writes must pass coremltools' own loader and type inference
//! (`validate_mlpackage.py --strict`). Needs python3 with coremltools; fails (never skips)
//! without it, because CI installs it.

mod common;

use std::process::Command;

use anemone_testkit::validator::validator_script;
use anemone_testkit::{python, validate};

use anemone_mil::{read_package, write_package, Program, WriteOptions};

fn write_validate_read(p: &Program, name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.mlpackage"));
    write_package(p, &path, &WriteOptions::default()).unwrap();
    validate(&path);
    let back = read_package(&path).unwrap();
    assert_eq!(
        anemone_mil::print_program(&back),
        anemone_mil::print_program(p)
    );
    assert!(
        back == *p,
        "{name}: program read back differs from the one written"
    );
}

#[test]
fn stateful_two_function_package_validates() {
    write_validate_read(&common::two_function_program(), "kv");
}

#[test]
fn conv_block_validates() {
    write_validate_read(&common::conv_program(), "conv");
}

#[test]
fn constexpr_compression_validates() {
    write_validate_read(&common::constexpr_program(), "constexpr");
}

#[test]
fn encoder_layer_validates() {
    write_validate_read(&common::encoder_program(), "encoder");
}

#[test]
fn every_op_type_validates() {
    let p = common::every_op_program();
    let mut seen: Vec<&str> = p.functions()[0]
        .operations()
        .iter()
        .map(|o| o.op.mil_type())
        .collect();
    for q in [
        common::two_function_program(),
        common::conv_program(),
        common::constexpr_program(),
    ] {
        seen.extend(
            q.functions()[0]
                .operations()
                .iter()
                .map(|o| o.op.mil_type()),
        );
    }
    // every op kind of the signature table appears in some validated program
    for t in anemone_mil::OpKind::all().map(anemone_mil::OpKind::mil_type) {
        assert!(seen.contains(&t), "no validated program uses {t}");
    }
    write_validate_read(&p, "every_op");
}

#[test]
fn other_spec_versions_validate() {
    use anemone_mil::SpecVersion;
    for spec in [SpecVersion::V7, SpecVersion::V8, SpecVersion::V10] {
        let mut p = common::conv_program();
        p.spec = spec;
        write_validate_read(&p, &format!("conv_spec{}", spec.number()));
    }
    let mut p = common::two_function_program();
    p.spec = SpecVersion::V10;
    write_validate_read(&p, "kv_spec10");
}

#[test]
fn corrupted_package_is_rejected_by_the_validator() {
    // The validator check must be able to fail: a record sentinel overwritten must be caught.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.mlpackage");
    write_package(&common::conv_program(), &path, &WriteOptions::default()).unwrap();
    let wb = path.join("Data/com.apple.CoreML/weights/weight.bin");
    let mut bytes = std::fs::read(&wb).unwrap();
    bytes[64] = 0;
    std::fs::write(&wb, bytes).unwrap();
    let out = Command::new(python())
        .arg(validator_script())
        .arg("--strict")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "validator accepted a corrupted weight.bin"
    );
    let err = read_package(&path).unwrap_err().to_string();
    assert!(err.contains("sentinel"), "{err}");
}

/// A package written by coremltools itself (stateful, slice_update, constexpr, multi-function)
/// reads into our model.
#[test]
fn reads_a_coremltools_multifunction_package() {
    let dir = tempfile::tempdir().unwrap();
    let script = r#"
import sys, numpy as np, coremltools as ct
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
out = sys.argv[1]
rng = np.random.default_rng(0)
W = rng.standard_normal((8, 8, 1, 1)).astype(np.float16)
def mk(T):
    @mb.program(input_specs=[mb.TensorSpec((1, 8, 1, T), dtype=types.fp16),
                             mb.TensorSpec((1,), dtype=types.int32),
                             mb.StateTensorSpec((1, 8, 1, 32), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(x, pos, cache):
        y = mb.conv(x=x, weight=W, name="proj")
        c = mb.read_state(input=cache)
        begin = mb.concat(values=[np.array([0, 0, 0], dtype=np.int32), pos], axis=0)
        end = mb.add(x=begin, y=np.array([1, 8, 1, T], dtype=np.int32))
        u = mb.slice_update(x=c, update=y, begin=begin, end=end)
        mb.coreml_update_state(state=cache, value=u)
        q = mb.constexpr_blockwise_shift_scale(data=rng.integers(-8, 7, (16, 8)).astype(types.np_int4_dtype), scale=np.ones((16, 1), np.float16))
        l = mb.constexpr_lut_to_dense(indices=rng.integers(0, 16, (16, 8)).astype(types.np_uint4_dtype), lut=rng.random((4, 1, 16, 1)).astype(np.float16))
        s = mb.softmax(x=y, axis=1)
        return s, mb.add(x=q, y=l)
    return prog
for T in (1, 4):
    m = ct.convert(mk(T), convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
                   compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    m.save(f"{out}/f{T}.mlpackage")
d = ct.utils.MultiFunctionDescriptor()
d.add_function(f"{out}/f1.mlpackage", src_function_name="main", target_function_name="decode")
d.add_function(f"{out}/f4.mlpackage", src_function_name="main", target_function_name="prefill")
d.default_function_name = "decode"
ct.utils.save_multifunction(d, f"{out}/mf.mlpackage")
"#;
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "coremltools script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = read_package(&dir.path().join("mf.mlpackage")).unwrap();
    assert_eq!(p.functions().len(), 2);
    assert_eq!(p.default_function_name(), "decode");
    let dec = p.function("decode").unwrap();
    let types: Vec<&str> = dec.operations().iter().map(|o| o.op.mil_type()).collect();
    for t in [
        "conv",
        "read_state",
        "slice_update",
        "write_state",
        "constexpr_blockwise_shift_scale",
        "constexpr_lut_to_dense",
        "softmax",
    ] {
        assert!(
            types.contains(&t),
            "read-back decode() lacks {t}: {types:?}"
        );
    }
    assert_eq!(dec.state_inputs().count(), 1);
    let single = read_package(&dir.path().join("f4.mlpackage")).unwrap();
    assert_eq!(single.functions().len(), 1);
    assert_eq!(single.default_function_name(), "main");
    let main = single.function("main").unwrap();
    assert_eq!(main.tensor_type(main.inputs()[0]).shape, [1, 8, 1, 4]);
    // And what we read, we can write again, and coremltools accepts it.
    let again = dir.path().join("again.mlpackage");
    write_package(&p, &again, &WriteOptions::default()).unwrap();
    validate(&again);
}
