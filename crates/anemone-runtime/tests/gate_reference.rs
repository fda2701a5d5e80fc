//! One reference run shared by the gates of two engines (`gate --compare`, `doctor`): the
//! reports are exactly those of gates that each ran the reference themselves, and the reference
//! runs once per prompt step.

mod pipeline_common;

use anemone_exec::ExecutorBackend;
use anemone_models::ane::{ChunkOptions, Precision};
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::gate::{
    run_gate, run_gate_traced, GateOptions, GateReference, ResolvedPrompt,
};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use pipeline_common::*;

fn report_without_time(report: &anemone_runtime::gate::GateReport) -> serde_json::Value {
    let mut v = serde_json::to_value(report).unwrap();
    v.as_object_mut().unwrap().remove("seconds");
    v
}

#[test]
fn a_shared_reference_gives_the_same_reports_and_runs_once() {
    let fixture = &oracle_fixtures()[0];
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    let options = small_options(ChunkOptions {
        context: 32,
        prefill_len: 4,
        ..ChunkOptions::default()
    });
    convert_to(&fixture.dir, &bundle, &options);
    let checkpoint = anemone_models::open_checkpoint(&fixture.dir).unwrap();
    let load_reference = || {
        ReferenceModel::load(
            &checkpoint,
            &ReferenceOptions {
                threads: Some(1),
                context_len: None,
                huge_pages: false,
            },
        )
        .unwrap()
    };
    let prompts = [
        ResolvedPrompt {
            label: "greedy".into(),
            ids: vec![1, 2, 3, 4, 5],
            expect: None,
            force_ids: None,
        },
        ResolvedPrompt {
            label: "forced".into(),
            ids: vec![7, 3],
            expect: None,
            force_ids: Some(vec![9, 4]),
        },
    ];
    let gate_options = GateOptions {
        steps: 4,
        ..GateOptions::default()
    };
    // steps per prompt: 4 greedy; the forced prompt stops after its 2 forced ids (3 steps)
    let total_steps = 4 + 3;
    let engines = [Precision::Fp16, Precision::Fp32];
    let pipeline_options = PipelineOptions {
        verify_hashes: false,
        host_threads: Some(1),
        ..PipelineOptions::default()
    };
    let open = |precision| {
        Pipeline::open(&bundle, ExecutorBackend::new(precision), &pipeline_options).unwrap()
    };

    let mut alone_model = load_reference();
    let alone: Vec<_> = engines
        .iter()
        .map(|&precision| {
            let report = run_gate(
                &open(precision),
                &mut alone_model,
                &prompts,
                None,
                &gate_options,
                &mut |_| {},
            )
            .unwrap();
            report_without_time(&report)
        })
        .collect();

    let mut shared_model = load_reference();
    let mut shared = GateReference::new(&mut shared_model);
    for (&precision, want) in engines.iter().zip(&alone) {
        let report = run_gate_traced(
            &open(precision),
            &mut shared,
            &prompts,
            None,
            &gate_options,
            &mut |_| {},
            None,
        )
        .unwrap();
        assert_eq!(&report_without_time(&report), want, "{precision:?}");
        assert_eq!(
            shared.forwards(),
            total_steps,
            "one reference forward per prompt step, whichever engine asked first"
        );
    }
    assert_ne!(alone[0], alone[1], "the two engines differ (fp16 vs fp32)");
}
