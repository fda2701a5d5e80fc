//! `convert` on the random-init oracle fixtures: every package passes coremltools' validator,
//! the manifest describes and hashes what was written, output is reproducible, existing output
//! is refused, bad options are named.

use anemone_mil::staging::StagingError;
use std::path::Path;

use anemone_models::ane::{
    lint_program, ChunkOptions, ChunkSizing, LmHeadPlacement, NormForm, Precision, Severity,
    StateLayout, Uncompressed,
};
use anemone_models::bundle::{
    self, convert, read_manifest, verify_files, BundleError, ConvertOptions,
};
use anemone_testkit::{oracle_dir as oracle_fixture, tree_bytes, validate};

fn options(layers_per_chunk: usize, layout: StateLayout) -> ConvertOptions {
    ConvertOptions {
        chunk: ChunkOptions {
            context: 64,
            prefill_len: 8,
            state_layout: layout,
            ..ChunkOptions::default()
        },
        sizing: ChunkSizing::LayersPerChunk(layers_per_chunk),
        lm_head: LmHeadPlacement::Host,
        force: false,
    }
}

fn run(
    model: &Path,
    out: &Path,
    opts: &ConvertOptions,
) -> Result<bundle::ConvertSummary, BundleError> {
    let ckpt = anemone_models::open_checkpoint(model).unwrap();
    convert(&ckpt, out, opts, &Uncompressed, &mut |_| {})
}

/// Converts, validates every package, checks hashes and the lint; returns the manifest.
fn convert_and_check(fixture: &str, opts: &ConvertOptions) -> bundle::Manifest {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let summary = run(&oracle_fixture(fixture), &out, opts).unwrap();
    let manifest = read_manifest(&out).unwrap();
    assert_eq!(manifest, summary.manifest);
    let checks = verify_files(&out, &manifest).unwrap();
    assert!(
        checks.iter().all(|c| c.ok),
        "{fixture}: hash mismatch: {checks:?}"
    );
    assert!(manifest.files.contains_key("host.safetensors"));
    let covered: usize = manifest.chunks.iter().map(|c| c.layer_count).sum();
    assert_eq!(covered, manifest.config.num_hidden_layers);
    for rel in manifest.package_paths() {
        let pkg = out.join(rel);
        validate(&pkg);
        let program = anemone_mil::read_package(&pkg).unwrap();
        let weights = std::fs::metadata(pkg.join("Data/com.apple.CoreML/weights/weight.bin"))
            .unwrap()
            .len();
        let errors: Vec<_> = lint_program(&program, weights)
            .into_iter()
            .filter(|f| f.severity == Severity::Error)
            .collect();
        assert!(errors.is_empty(), "{fixture} {rel}: lint errors {errors:?}");
    }
    manifest
}

#[test]
fn every_fixture_converts_in_both_state_layouts() {
    for fixture in [
        "llama_gqa4",
        "qwen2_mha",
        "qwen3_gqa4",
        "qwen3_gqa2_headdim24",
    ] {
        for (per, layout) in [
            (1, StateLayout::Unified),
            (2, StateLayout::Split),
            (2, StateLayout::Unified),
        ] {
            let m = convert_and_check(fixture, &options(per, layout));
            let chunk = &m.chunks[0];
            let decode = &chunk.functions[0];
            assert_eq!(decode.name, "decode");
            assert_eq!(chunk.functions[1].name, "prefill");
            let expect_states = match layout {
                StateLayout::Unified => 1,
                StateLayout::Split => 2,
            };
            assert_eq!(decode.states.len(), expect_states, "{fixture} {layout:?}");
            for s in &decode.states {
                let r = s.shape.len();
                assert!(s.shape[r - 2] % 32 == 0 && s.shape[r - 1] == 64, "{s:?}");
            }
            assert_eq!(chunk.functions[1].inputs[0].shape[3], 8);
        }
    }
}

#[test]
fn lm_head_package_and_norm_forms_validate() {
    for norm in [
        NormForm::Naive,
        NormForm::MaxScaled,
        NormForm::LayernormTrick,
    ] {
        let mut opts = options(2, StateLayout::Unified);
        opts.chunk.norm = norm;
        opts.lm_head = LmHeadPlacement::Package;
        let m = convert_and_check("qwen3_mha_tied", &opts);
        let head = m.lm_head.as_ref().expect("lm head package");
        assert_eq!(
            head.vocab_slices.iter().map(|s| s.1).sum::<usize>(),
            m.config.vocab_size
        );
        assert_eq!(m.conversion.norm, norm);
        assert!(!m.host.tensors.contains(&"lm_head.weight".to_string()));
    }
}

#[test]
fn fp32_precision_validates() {
    let mut opts = options(1, StateLayout::Unified);
    opts.chunk.precision = Precision::Fp32;
    let m = convert_and_check("qwen2_gqa3_tied", &opts);
    assert_eq!(
        m.chunks[0].functions[0].inputs[0].dtype,
        anemone_mil::DType::F32
    );
    assert_eq!(m.host.dtype, "F32");
}

#[test]
fn identical_inputs_give_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(1, StateLayout::Unified);
    let model = oracle_fixture("llama_gqa4");
    run(&model, &dir.path().join("a"), &opts).unwrap();
    run(&model, &dir.path().join("b"), &opts).unwrap();
    let (a, b) = (
        tree_bytes(&dir.path().join("a")),
        tree_bytes(&dir.path().join("b")),
    );
    assert_eq!(a.len(), b.len());
    for ((pa, ba), (pb, bb)) in a.iter().zip(&b) {
        assert_eq!(pa, pb);
        assert!(ba == bb, "{pa} differs between two runs");
    }
}

#[test]
fn existing_output_is_refused_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), b"mine").unwrap();
    let mut opts = options(1, StateLayout::Unified);
    let model = oracle_fixture("qwen3_gqa4");
    let err = run(&model, &out, &opts).unwrap_err();
    assert!(
        matches!(err, BundleError::Staging(StagingError::Exists { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("--force"), "{err}");
    assert_eq!(std::fs::read(out.join("keep.txt")).unwrap(), b"mine");
    opts.force = true;
    // --force replaces a bundle or an empty directory, never a directory of the user's
    let err = run(&model, &out, &opts).unwrap_err();
    assert!(
        matches!(err, BundleError::Staging(StagingError::NotOurs { .. })),
        "{err}"
    );
    assert_eq!(std::fs::read(out.join("keep.txt")).unwrap(), b"mine");
    std::fs::remove_file(out.join("keep.txt")).unwrap();
    run(&model, &out, &opts).unwrap();
    assert!(out.join("anemone.json").is_file());
    run(&model, &out, &opts).unwrap();
    // no temp dirs left next to it
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
}

#[test]
fn bad_options_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let model = oracle_fixture("qwen3_gqa4");
    let cases: Vec<(ConvertOptions, &str)> = vec![
        (
            {
                let mut o = options(1, StateLayout::Unified);
                o.chunk.context = 100;
                o
            },
            "multiple of 32",
        ),
        (
            {
                let mut o = options(1, StateLayout::Unified);
                o.chunk.context = 512;
                o
            },
            "max_position_embeddings",
        ),
        (
            {
                let mut o = options(1, StateLayout::Unified);
                o.chunk.prefill_len = 65;
                o
            },
            "prefill-len",
        ),
        (
            {
                let mut o = options(1, StateLayout::Unified);
                o.chunk.prefill_len = 0;
                o
            },
            "prefill-len",
        ),
        (options(0, StateLayout::Unified), "layers-per-chunk"),
        (
            {
                let mut o = options(1, StateLayout::Unified);
                o.sizing = ChunkSizing::MaxMegabytes(0);
                o
            },
            "chunk-size-mb",
        ),
    ];
    for (i, (opts, needle)) in cases.into_iter().enumerate() {
        let out = dir.path().join(format!("b{i}"));
        let err = run(&model, &out, &opts).unwrap_err().to_string();
        assert!(
            err.contains(needle),
            "case {i}: `{err}` does not mention {needle}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn chunk_size_mb_groups_layers_by_weight_bytes() {
    // qwen3_gqa4 layers are ~60 KiB in fp16: 1 MiB holds both layers in one chunk
    let mut opts = options(1, StateLayout::Unified);
    opts.sizing = ChunkSizing::MaxMegabytes(1);
    let m = convert_and_check("qwen3_gqa4", &opts);
    assert_eq!(m.chunks.len(), 1);
    assert_eq!(m.chunks[0].layer_count, 2);
}
