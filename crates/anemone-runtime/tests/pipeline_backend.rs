//! What the pipeline asks of a backend, seen through a recording wrapper around the executor:
//! every package is loaded with the content key the bundle manifest gives (the same key hashing
//! the package gives, so a compiled-model cache is shared whichever way it was keyed), and none
//! with `verify_hashes` off; activations stay in backend buffers between chunks, the host reading
//! one buffer per feed (the last chunk's output, for the host LM head) unless a feed is traced,
//! and none with an LM-head package, which takes the last chunk's buffer as it is.

mod pipeline_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anemone_backend::{Backend, CheckedOutputs, LoadReport, Tensor};
use anemone_exec::ExecutorBackend;
use anemone_mil::DType;
use anemone_models::ane::{lm_head, ChunkOptions, LmHeadPlacement, Precision};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use pipeline_common::*;

#[derive(Default)]
struct Calls {
    loads: Vec<(PathBuf, Option<String>)>,
    buffers_made: usize,
    buffer_reads: usize,
    position_copies: usize,
    predictions: usize,
}

struct Recording {
    inner: ExecutorBackend,
    calls: Arc<Mutex<Calls>>,
}

impl Backend for Recording {
    type Package = <ExecutorBackend as Backend>::Package;
    type State = <ExecutorBackend as Backend>::State;
    type Buffer = <ExecutorBackend as Backend>::Buffer;
    type Error = <ExecutorBackend as Backend>::Error;

    fn name(&self) -> String {
        format!("recording-{}", self.inner.name())
    }
    fn load(&self, path: &Path) -> Result<Self::Package, Self::Error> {
        Ok(self.load_identified(path, None)?.0)
    }
    fn load_identified(
        &self,
        path: &Path,
        content_key: Option<&str>,
    ) -> Result<(Self::Package, LoadReport), Self::Error> {
        let mut calls = self.calls.lock().unwrap();
        calls
            .loads
            .push((path.to_path_buf(), content_key.map(str::to_string)));
        self.inner.load_identified(path, content_key)
    }
    fn new_state(&self, p: &Self::Package, f: &str) -> Result<Self::State, Self::Error> {
        self.inner.new_state(p, f)
    }
    fn reset_state(&self, state: &mut Self::State) {
        self.inner.reset_state(state)
    }
    fn predict(
        &self,
        p: &Self::Package,
        f: &str,
        inputs: &HashMap<String, Tensor>,
        state: &mut Self::State,
    ) -> Result<HashMap<String, Tensor>, Self::Error> {
        self.calls.lock().unwrap().predictions += 1;
        self.inner.predict(p, f, inputs, state)
    }
    fn new_buffer(&self, dtype: DType, shape: &[usize]) -> Result<Tensor, Self::Error> {
        self.calls.lock().unwrap().buffers_made += 1;
        self.inner.new_buffer(dtype, shape)
    }
    fn write_buffer(&self, buffer: &mut Tensor, values: &Tensor) -> Result<(), Self::Error> {
        self.inner.write_buffer(buffer, values)
    }
    fn read_buffer(&self, buffer: &Tensor) -> Result<Tensor, Self::Error> {
        self.calls.lock().unwrap().buffer_reads += 1;
        self.inner.read_buffer(buffer)
    }
    fn copy_position(
        &self,
        from: &Tensor,
        position: usize,
        to: &mut Tensor,
    ) -> Result<(), Self::Error> {
        self.calls.lock().unwrap().position_copies += 1;
        self.inner.copy_position(from, position, to)
    }
    fn predict_buffers(
        &self,
        p: &Self::Package,
        f: &str,
        inputs: &mut HashMap<String, Tensor>,
        buffer_inputs: &mut [(&str, &mut Tensor)],
        buffer_outputs: &mut [(&str, &mut Tensor)],
        state: &mut Self::State,
        checked: bool,
    ) -> Result<CheckedOutputs, Self::Error> {
        self.calls.lock().unwrap().predictions += 1;
        self.inner
            .predict_buffers(p, f, inputs, buffer_inputs, buffer_outputs, state, checked)
    }
}

fn open(dir: &Path, verify_hashes: bool) -> (Pipeline<Recording>, Arc<Mutex<Calls>>) {
    let calls = Arc::new(Mutex::new(Calls::default()));
    let backend = Recording {
        inner: ExecutorBackend::new(Precision::Fp32),
        calls: Arc::clone(&calls),
    };
    let options = PipelineOptions {
        verify_hashes,
        host_threads: Some(1),
        ..PipelineOptions::default()
    };
    (Pipeline::open(dir, backend, &options).unwrap(), calls)
}

#[test]
fn packages_are_keyed_by_the_manifest_and_activations_stay_in_buffers() {
    let fixture = &oracle_fixtures()[0];
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    let options = small_options(ChunkOptions {
        context: 32,
        prefill_len: 4,
        precision: Precision::Fp32,
        ..ChunkOptions::default()
    });
    convert_to(&fixture.dir, &bundle, &options);

    let (pipeline, calls) = open(&bundle, true);
    let chunks = pipeline.chunk_depths().len();
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.loads.len(), chunks, "{}", fixture.name);
        for (path, key) in &calls.loads {
            let key = key
                .as_deref()
                .expect("a verified bundle gives every package a key");
            assert_eq!(
                key,
                anemone_coreml::cache::package_hash(path).unwrap(),
                "{}",
                path.display()
            );
        }
        let keys: std::collections::HashSet<_> = calls.loads.iter().map(|(_, k)| k).collect();
        assert_eq!(keys.len(), chunks, "every chunk has its own content");
    }
    assert_eq!(
        pipeline.load_timings().compile_s,
        0.0,
        "the executor compiles nothing"
    );

    // 6 ids: one full prefill window, then a 2-token window, then one decode step
    let mut session = pipeline.session().unwrap();
    session.feed(&[1, 2, 3, 4, 5, 6]).unwrap();
    session.feed(&[7]).unwrap();
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.predictions, 3 * chunks);
        assert_eq!(
            calls.buffer_reads, 2,
            "one read per feed: the last chunk's output, for the host LM head"
        );
        assert_eq!(calls.position_copies, 0);
        assert_eq!(
            calls.buffers_made, 4,
            "two buffers per window width (4 and 1)"
        );
    }
    session.feed_traced(&[8]).unwrap();
    assert_eq!(calls.lock().unwrap().buffer_reads, 2 + chunks + 1);

    // unverified files are not vouched for by the manifest: no key
    let (_, unverified) = open(&bundle, false);
    assert!(unverified
        .lock()
        .unwrap()
        .loads
        .iter()
        .all(|(_, key)| key.is_none()));
}

#[test]
fn the_lm_head_package_takes_the_hidden_state_from_the_backend_buffer() {
    let fixture = &oracle_fixtures()[0];
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    let mut options = small_options(ChunkOptions {
        context: 32,
        prefill_len: 4,
        precision: Precision::Fp32,
        ..ChunkOptions::default()
    });
    options.lm_head = LmHeadPlacement::Package;
    convert_to(&fixture.dir, &bundle, &options);

    let (pipeline, calls) = open(&bundle, true);
    let chunks = pipeline.chunk_depths().len();
    let ids = [1, 2, 3, 4, 5, 6];
    let mut session = pipeline.session().unwrap();
    // windows of 4 and 2 (padded to 4): the last token's column is copied inside the backend
    let logits = session.feed(&ids).unwrap();
    {
        let calls = calls.lock().unwrap();
        assert_eq!(
            calls.predictions,
            2 * chunks + 1,
            "chunks, then the LM head"
        );
        assert_eq!(
            calls.buffer_reads, 0,
            "the hidden state never reaches the host"
        );
        assert_eq!(calls.position_copies, 1, "position 1 of the 4-wide window");
    }
    // a decode window is one wide: its buffer goes to the LM head as it is
    session.feed(&[7]).unwrap();
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.buffer_reads, 0);
        assert_eq!(calls.position_copies, 1);
        assert_eq!(calls.predictions, 3 * chunks + 2);
    }

    // the same logits, bit for bit, as the LM-head package run on the host-read hidden state
    let mut traced = pipeline.session().unwrap();
    let trace = traced.feed_traced(&ids).unwrap();
    assert_eq!(trace.logits, logits);
    let last_chunk = trace.chunk_outputs.last().unwrap();
    let h = last_chunk.len() / ids.len();
    let hidden = last_chunk[last_chunk.len() - h..].to_vec();
    let executor = ExecutorBackend::new(Precision::Fp32);
    let entry = pipeline.manifest().lm_head.as_ref().unwrap();
    let package = executor.load(&bundle.join(&entry.path)).unwrap();
    let mut state = executor.new_state(&package, lm_head::FUNCTION).unwrap();
    let inputs = HashMap::from([(
        lm_head::INPUT.to_string(),
        Tensor::new(DType::F32, vec![1, h, 1, 1], hidden).unwrap(),
    )]);
    let mut outputs = executor
        .predict(&package, lm_head::FUNCTION, &inputs, &mut state)
        .unwrap();
    let host_path: Vec<f32> = (0..entry.vocab_slices.len())
        .flat_map(|i| outputs.remove(&format!("logits_{i}")).unwrap().data)
        .collect();
    assert_eq!(host_path.len(), logits.len());
    assert!(
        host_path
            .iter()
            .zip(&logits)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "logits through the buffer differ from logits through the host"
    );
}
