//! Real GGUF models through the reference forward and the generation loop reproduce transformers'
//! greedy output (tests/fixtures/real/<model>.json). Models are located via `ANEMONE_MODELS`
//! (default `<workspace>/models`); `scripts/fetch-models.sh` fetches them.

use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::{generate, prompt, GenerationOptions, TextStream};
use serde::Deserialize;

/// Our dequantization and summation order against transformers' on 0.1–0.5B real models.
const REAL_LOGITS_TOLERANCE: f32 = 2e-2;

#[derive(Deserialize)]
struct RealFixture {
    gguf: String,
    new_tokens: usize,
    prompts: Vec<RealPrompt>,
}

#[derive(Deserialize)]
struct RealPrompt {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    text: String,
    steps: Vec<RealStep>,
}

#[derive(Deserialize)]
struct RealStep {
    top_ids: Vec<u32>,
    top_logits: Vec<f32>,
}

fn fixture(name: &str) -> RealFixture {
    let path = anemone_testkit::real_fixture(&format!("{name}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Greedy generation of every fixture prompt: same prompt ids, same continuation ids, same text,
/// and transformers' top-5 logits at every step within tolerance.
fn check_model(name: &str) -> Vec<String> {
    let fixture = fixture(name);
    let checkpoint =
        anemone_models::open_checkpoint(anemone_testkit::model(&fixture.gguf)).unwrap();
    let bundle = checkpoint
        .tokenizer
        .as_ref()
        .expect("GGUF carries a tokenizer");
    let mut model = ReferenceModel::load(
        &checkpoint,
        &ReferenceOptions {
            threads: Some(2),
            context_len: Some(256),
            huge_pages: false,
        },
    )
    .unwrap();
    let options = GenerationOptions {
        max_tokens: fixture.new_tokens,
        capture_logits: true,
        stop_ids: prompt::stop_ids(&checkpoint.config.eos_token_ids, Some(bundle)),
        ..Default::default()
    };
    let mut texts = Vec::new();
    for case in &fixture.prompts {
        let ids = prompt::encode_plain(bundle, &case.prompt).unwrap();
        assert_eq!(
            ids, case.prompt_ids,
            "{name}: prompt ids of {:?}",
            case.prompt
        );
        let mut stream = TextStream::new(&bundle.tokenizer);
        let mut streamed = String::new();
        let g = generate(&mut model, &ids, &options, &mut |id| {
            streamed.extend(stream.push(id)?);
            Ok(())
        })
        .unwrap();
        streamed.extend(stream.finish().unwrap());
        assert_eq!(
            g.generated_ids, case.greedy_ids,
            "{name}: greedy continuation of {:?}",
            case.prompt
        );
        assert_eq!(
            streamed, case.text,
            "{name}: streamed text of {:?}",
            case.prompt
        );
        let vocab = g.vocab_size;
        for (step, want) in case.steps.iter().enumerate() {
            let row = &g.logits[step * vocab..(step + 1) * vocab];
            for (&id, &logit) in want.top_ids.iter().zip(&want.top_logits) {
                let ours = row[id as usize];
                assert!(
                    (ours - logit).abs() <= REAL_LOGITS_TOLERANCE,
                    "{name}: {:?} step {step} token {id}: ours {ours}, transformers {logit}",
                    case.prompt
                );
            }
        }
        texts.push(streamed);
    }
    texts
}

#[test]
fn smollm2_greedy_matches_transformers_and_knows_paris() {
    let texts = check_model("smollm2-135m-instruct");
    assert!(texts[0].starts_with(" Paris"), "got {:?}", texts[0]);
}

#[test]
fn qwen25_coder_greedy_matches_transformers() {
    check_model("qwen2.5-coder-0.5b-instruct");
}
