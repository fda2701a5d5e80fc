//! Package writing and reading: round trips, deterministic bytes, shared weights written once,
//! refusal to overwrite, named errors on corrupt files, golden snapshots, and function interfaces
//! read from the proto alone.

mod common;

use std::path::Path;

use anemone_mil::{
    print_program, read_model_proto, read_package, read_package_interface, write_model_proto,
    write_package, BlobFile, MilError, WriteOptions,
};

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().display().to_string(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn round_trip_is_exact() {
    for p in [
        common::two_function_program(),
        common::conv_program(),
        common::constexpr_program(),
        common::encoder_program(),
    ] {
        let enc = write_model_proto(&p).unwrap();
        let blobs = [(
            "weight.bin".to_string(),
            BlobFile::parse("weight.bin", enc.weights.clone()).unwrap(),
        )]
        .into();
        let back = read_model_proto("model.mlmodel", &enc.model, &blobs).unwrap();
        assert_eq!(print_program(&back), print_program(&p));
        assert!(back == p);
    }
}

#[test]
fn same_program_gives_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.mlpackage");
    let b = dir.path().join("sub/b.mlpackage");
    let sa = write_package(
        &common::two_function_program(),
        &a,
        &WriteOptions::default(),
    )
    .unwrap();
    // a freshly built (not cloned) program, so no buffer is shared between the two writes
    let sb = write_package(
        &common::two_function_program(),
        &b,
        &WriteOptions::default(),
    )
    .unwrap();
    assert_eq!(files(&a), files(&b));
    assert_eq!(sa.model_sha256, sb.model_sha256);
    let manifest = String::from_utf8(std::fs::read(a.join("Manifest.json")).unwrap()).unwrap();
    assert!(manifest.contains("\"rootModelIdentifier\""));
    // a different program gets different content-derived identifiers
    let c = dir.path().join("c.mlpackage");
    write_package(&common::conv_program(), &c, &WriteOptions::default()).unwrap();
    assert_ne!(
        std::fs::read(c.join("Manifest.json")).unwrap(),
        manifest.as_bytes()
    );
}

#[test]
fn shared_weights_are_written_once() {
    use coreml_proto::proto::{mil_spec, model, Model};
    use prost::Message;
    let p = common::two_function_program();
    let enc = write_model_proto(&p).unwrap();
    // wk, wv and the norm weight: 3 blobs, not 6
    assert_eq!(enc.blob_count, 3);
    let m = Model::decode(enc.model.as_slice()).unwrap();
    let Some(model::Type::MlProgram(prog)) = m.r#type else {
        panic!("not an ML program")
    };
    let offsets = |f: &str| -> Vec<(String, u64)> {
        let func = &prog.functions[f];
        let block = &func.block_specializations[&func.opset];
        let mut v: Vec<(String, u64)> = block
            .operations
            .iter()
            .filter_map(
                |op| match op.attributes.get("val").and_then(|v| v.value.as_ref()) {
                    Some(mil_spec::value::Value::BlobFileValue(b)) => {
                        Some((op.outputs[0].name.clone(), b.offset))
                    }
                    _ => None,
                },
            )
            .collect();
        v.sort();
        v
    };
    assert_eq!(offsets("decode"), offsets("prefill"));
    assert_eq!(offsets("decode").len(), 3);
    let desc = m.description.unwrap();
    assert_eq!(desc.default_function_name, "decode");
    let names: Vec<&str> = desc.functions.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["decode", "prefill"]);
    assert_eq!(desc.functions[0].state.len(), 2);
    assert!(
        desc.input.is_empty(),
        "multi-function models describe inputs per function"
    );
}

#[test]
fn blob_layout_matches_milblob_v2() {
    let enc = write_model_proto(&common::two_function_program()).unwrap();
    let w = &enc.weights;
    assert_eq!(u32::from_le_bytes(w[0..4].try_into().unwrap()), 3);
    assert_eq!(u32::from_le_bytes(w[4..8].try_into().unwrap()), 2);
    assert!(w[8..64].iter().all(|&b| b == 0));
    let blob = BlobFile::parse("weight.bin", w.clone()).unwrap();
    let mut end = 64u64;
    for r in blob.records() {
        assert_eq!(r.offset % 64, 0);
        assert_eq!(r.data_offset, r.offset + 64);
        assert_eq!(
            u32::from_le_bytes(w[r.offset as usize..][..4].try_into().unwrap()),
            0xDEAD_BEEF
        );
        assert!(r.offset >= end);
        end = r.data_offset + r.size_bytes;
    }
    assert_eq!(end as usize, w.len(), "file ends right after the last blob");
}

#[test]
fn refuses_to_overwrite_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.mlpackage");
    write_package(&common::conv_program(), &path, &WriteOptions::default()).unwrap();
    let before = files(&path);
    let e = write_package(&common::encoder_program(), &path, &WriteOptions::default()).unwrap_err();
    assert!(
        matches!(
            e,
            MilError::Staging(anemone_mil::staging::StagingError::Exists { .. })
        ),
        "{e:?}"
    );
    assert_eq!(
        files(&path),
        before,
        "a refused write must leave the package untouched"
    );
    write_package(
        &common::encoder_program(),
        &path,
        &WriteOptions { overwrite: true },
    )
    .unwrap();
    assert_eq!(read_package(&path).unwrap(), common::encoder_program());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "temp dirs left behind: {leftovers:?}");
}

#[test]
fn corrupt_files_give_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.mlpackage");
    write_package(&common::conv_program(), &path, &WriteOptions::default()).unwrap();
    let wb = path.join("Data/com.apple.CoreML/weights/weight.bin");
    let good = std::fs::read(&wb).unwrap();

    std::fs::write(&wb, &good[..good.len() - 10]).unwrap();
    let e = read_package(&path).unwrap_err().to_string();
    assert!(
        e.contains("weight.bin") && e.contains("outside the file"),
        "{e}"
    );

    let mut bad = good.clone();
    bad[4] = 3; // version
    std::fs::write(&wb, &bad).unwrap();
    let e = read_package(&path).unwrap_err().to_string();
    assert!(e.contains("version 3"), "{e}");

    let mut bad = good.clone();
    bad[64 + 4] = 2; // first record: fp16 -> fp32
    std::fs::write(&wb, &bad).unwrap();
    let e = read_package(&path).unwrap_err().to_string();
    assert!(
        e.contains("declared fp16") || e.contains("outside the file"),
        "{e}"
    );

    std::fs::write(&wb, &good).unwrap();
    let model = path.join("Data/com.apple.CoreML/model.mlmodel");
    std::fs::write(&model, b"not a protobuf at all").unwrap();
    let e = read_package(&path).unwrap_err().to_string();
    assert!(e.contains("model.mlmodel"), "{e}");

    std::fs::write(path.join("Manifest.json"), "{").unwrap();
    let e = read_package(&path).unwrap_err().to_string();
    assert!(e.contains("Manifest.json"), "{e}");
}

#[test]
fn golden_mil_text_and_weights() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let p = common::two_function_program();
    let text = print_program(&p);
    let enc = write_model_proto(&p).unwrap();
    let cases: [(&str, &[u8]); 2] = [
        ("kv_two_function.mil", text.as_bytes()),
        ("kv_two_function.weight.bin", &enc.weights),
    ];
    for (name, bytes) in cases {
        anemone_testkit::assert_golden(&golden.join(name), bytes);
    }
}

#[test]
fn functions_read_back_share_weight_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.mlpackage");
    write_package(
        &common::two_function_program(),
        &path,
        &WriteOptions::default(),
    )
    .unwrap();
    let p = read_package(&path).unwrap();
    let wk = |f: &str| {
        let func = p.function(f).unwrap();
        let op = func.operations().iter().find(|o| o.name == "wk").unwrap();
        match &op.op {
            anemone_mil::Op::Const { value } => value.shared_bytes().clone(),
            other => panic!("wk is {other:?}"),
        }
    };
    assert!(
        wk("decode").same_storage(&wk("prefill")),
        "decode and prefill hold separate copies of wk"
    );
}

/// Flipped bytes anywhere in model.mlmodel or weight.bin give an error or a valid program,
/// never a panic.
#[test]
fn corrupted_bytes_never_panic() {
    let enc = write_model_proto(&common::two_function_program()).unwrap();
    let blob = || BlobFile::parse("weight.bin", enc.weights.clone()).unwrap();
    let mut read_ok = 0;
    for i in (0..enc.model.len()).step_by(7) {
        for flip in [0x01u8, 0x80, 0xFF] {
            let mut m = enc.model.clone();
            m[i] ^= flip;
            let blobs = [("weight.bin".to_string(), blob())].into();
            let r =
                std::panic::catch_unwind(|| read_model_proto("model.mlmodel", &m, &blobs).is_ok());
            read_ok += r.unwrap_or_else(|_| panic!("panic reading model with byte {i} ^ {flip:#x}"))
                as usize;
        }
    }
    assert!(
        read_ok > 0,
        "no corruption read at all: the harness is not exercising the reader"
    );
    for i in 0..enc.weights.len().min(4096) {
        let mut w = enc.weights.clone();
        w[i] ^= 0xA5;
        let r = std::panic::catch_unwind(|| {
            let Ok(b) = BlobFile::parse("weight.bin", w) else {
                return;
            };
            let blobs = [("weight.bin".to_string(), b)].into();
            let _ = read_model_proto("model.mlmodel", &enc.model, &blobs);
        });
        assert!(r.is_ok(), "panic on weight.bin byte {i}");
    }
    // truncations
    for n in (0..enc.model.len()).step_by(13) {
        let blobs = [("weight.bin".to_string(), blob())].into();
        let r = std::panic::catch_unwind(|| {
            read_model_proto("model.mlmodel", &enc.model[..n], &blobs).is_ok()
        });
        assert!(r.is_ok(), "panic on model truncated to {n} bytes");
    }
}

#[test]
fn overwrite_replaces_only_a_package() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.mlpackage");
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("notes.txt"), "mine").unwrap();
    let e = write_package(
        &common::conv_program(),
        &path,
        &WriteOptions { overwrite: true },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("not an output of anemone"), "{e}");
    assert_eq!(
        std::fs::read_to_string(path.join("notes.txt")).unwrap(),
        "mine"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "debris left behind: {leftovers:?}");
}

#[test]
fn interfaces_read_from_the_proto_alone_match_the_full_read() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("kv.mlpackage");
    write_package(
        &common::two_function_program(),
        &path,
        &WriteOptions::default(),
    )
    .unwrap();
    let program = read_package(&path).unwrap();
    // the weights are not needed: the interface reads with them gone
    let weights = path.join("Data/com.apple.CoreML/weights/weight.bin");
    std::fs::remove_file(&weights).unwrap();
    assert!(read_package(&path).is_err());
    let interfaces = read_package_interface(&path).unwrap();
    assert_eq!(interfaces.len(), 2);
    for (f, i) in program.functions().iter().zip(&interfaces) {
        assert_eq!(i.name, f.name());
        let named = |v: &anemone_mil::Var| (f.value_name(*v).to_string(), f.ty(*v).clone());
        assert_eq!(i.inputs, f.inputs().iter().map(named).collect::<Vec<_>>());
        assert_eq!(i.outputs, f.outputs().iter().map(named).collect::<Vec<_>>());
        assert!(
            i.state_inputs().count() > 0,
            "{}: the kv function has states",
            i.name
        );
    }
    let missing = read_package_interface(&tmp.path().join("none.mlpackage")).unwrap_err();
    assert!(missing.to_string().contains("none.mlpackage"), "{missing}");
}
