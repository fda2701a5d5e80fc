//! Never lose a user's data, never leave debris: `--force` only over our own outputs and never
//! over the input, SIGTERM/SIGKILL during a convert, two writers of one `--out`, and a reader
//! during a `--force` replace.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{anemone, fixture, model, text};

fn convert_args(model: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "convert".to_string(),
        model.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--context".into(),
        "64".into(),
        "--prefill-len".into(),
        "8".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run(args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    anemone(&args)
}

/// A convert that sleeps `delay_ms` at every progress step, so a signal lands mid-write.
fn spawn_slow(model: &Path, out: &Path, delay_ms: u64) -> Child {
    Command::new(env!("CARGO_BIN_EXE_anemone"))
        .args(convert_args(model, out, &[]))
        .env("ANEMONE_DEBUG_STEP_DELAY_MS", delay_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn anemone")
}

fn partial_of(out: &Path) -> PathBuf {
    let name = out.file_name().unwrap().to_string_lossy();
    out.with_file_name(format!(".{name}.anemone-partial"))
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[test]
fn force_onto_the_directory_holding_the_input_gguf_is_refused() {
    // The issue's reproduction: the GGUF lives in the directory given as --out.
    let dir = tempfile::tempdir().unwrap();
    let mm = dir.path().join("mm");
    std::fs::create_dir(&mm).unwrap();
    let gguf = mm.join("smollm2-135m-instruct.Q4_1.gguf");
    let source = model("smollm2-135m-instruct.Q4_1.gguf");
    if std::fs::hard_link(&source, &gguf).is_err() {
        std::fs::copy(&source, &gguf).unwrap();
    }
    let size = std::fs::metadata(&gguf).unwrap().len();
    let o = anemone(&[
        "convert",
        gguf.to_str().unwrap(),
        "--out",
        mm.to_str().unwrap(),
        "--force",
    ]);
    assert!(
        !o.status.success(),
        "convert --force over the input's dir succeeded"
    );
    let err = text(&o.stderr);
    assert!(err.contains("not an output of anemone"), "{err}");
    assert!(err.contains(mm.to_str().unwrap()), "{err}");
    assert_eq!(
        std::fs::metadata(&gguf).unwrap().len(),
        size,
        "the GGUF was touched"
    );
    assert_eq!(names(&mm), ["smollm2-135m-instruct.Q4_1.gguf"]);
    assert_eq!(names(dir.path()), ["mm"], "debris left beside --out");
}

#[test]
fn force_never_replaces_a_bundle_holding_the_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let first = run(&convert_args(&fixture("qwen3_gqa4"), &out, &[]));
    assert!(first.status.success(), "{}", text(&first.stderr));
    // the user keeps the checkpoint inside the bundle directory
    let inside = out.join("src");
    std::fs::create_dir(&inside).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture("qwen3_gqa4").join(f), inside.join(f)).unwrap();
    }
    let o = run(&convert_args(&inside, &out, &["--force"]));
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("is inside it"), "{err}");
    assert!(inside.join("model.safetensors").is_file());
    assert_eq!(names(dir.path()), ["b"]);
}

#[test]
fn sigterm_mid_convert_removes_the_partial_output_and_exits_143() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let mut child = spawn_slow(&fixture("qwen3_gqa4"), &out, 2000);
    wait_for(&partial_of(&out));
    signal(&child, "TERM");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143), "{status:?}");
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("interrupted: removed"), "{err}");
    assert!(
        names(dir.path()).is_empty(),
        "debris: {:?}",
        names(dir.path())
    );
}

#[test]
fn debris_of_earlier_versions_is_removed_only_when_ours_and_dead() {
    let dir = tempfile::tempdir().unwrap();
    // A pid above every kernel's limit: no process has it.
    let dead = 99_999_999;
    let legacy = dir.path().join(format!(".b.tmp-{dead}"));
    std::fs::create_dir(&legacy).unwrap();
    std::fs::write(legacy.join("anemone.json"), "{}").unwrap();
    let stranger = dir.path().join(format!(".cache.tmp-{dead}"));
    std::fs::create_dir(&stranger).unwrap();

    let listed = anemone(&["clean", dir.path().to_str().unwrap(), "--dry-run", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let report: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let partials = report["partials"].as_array().unwrap();
    assert_eq!(partials.len(), 1, "{report}");
    assert!(partials[0]["path"]
        .as_str()
        .unwrap()
        .ends_with(&format!(".b.tmp-{dead}")));

    let next = run(&convert_args(
        &fixture("qwen3_gqa4"),
        &dir.path().join("c"),
        &[],
    ));
    assert!(next.status.success(), "{}", text(&next.stderr));
    assert_eq!(
        names(dir.path()),
        [format!(".cache.tmp-{dead}"), "c".to_string()]
    );
}

#[test]
fn sigkill_debris_is_listed_by_clean_and_removed_by_the_next_convert() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let mut child = spawn_slow(&fixture("qwen3_gqa4"), &out, 2000);
    wait_for(&partial_of(&out));
    signal(&child, "KILL");
    child.wait().unwrap();
    assert!(partial_of(&out).is_dir(), "SIGKILL cannot clean up");

    let listed = anemone(&["clean", dir.path().to_str().unwrap(), "--dry-run", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let report: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let partials = report["partials"].as_array().unwrap();
    assert_eq!(partials.len(), 1, "{report}");
    assert!(partials[0]["path"]
        .as_str()
        .unwrap()
        .ends_with(".b.anemone-partial"));
    assert!(partial_of(&out).is_dir(), "--dry-run removed something");

    // the next convert into the same directory (another target) removes it
    let other = dir.path().join("c");
    let next = run(&convert_args(&fixture("qwen3_gqa4"), &other, &[]));
    assert!(next.status.success(), "{}", text(&next.stderr));
    assert_eq!(names(dir.path()), ["c"]);
    let clean = anemone(&["clean", dir.path().to_str().unwrap()]);
    assert!(clean.status.success());
    assert!(text(&clean.stdout).contains("no partial outputs"));
}

#[test]
fn a_second_writer_of_one_out_fails_cleanly_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let model = fixture("qwen3_gqa4");
    let first = spawn_slow(&model, &out, 600);
    wait_for(&partial_of(&out));
    for extra in [&[][..], &["--force"][..]] {
        let second = run(&convert_args(&model, &out, extra));
        assert!(!second.status.success(), "two writers of one --out");
        let err = text(&second.stderr);
        assert!(
            err.contains(&format!("pid {}", first.id())),
            "{extra:?}: {err}"
        );
    }
    let done = first.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", text(&done.stderr));
    assert_eq!(names(dir.path()), ["b"], "the loser left debris");
    let inspect = anemone(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    // a later writer without --force does not replace it silently
    let later = run(&convert_args(&model, &out, &[]));
    assert!(!later.status.success());
    assert!(text(&later.stderr).contains("--force"));
}

#[test]
fn a_reader_during_force_replaces_always_sees_a_whole_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let model = fixture("qwen3_gqa4");
    let first = run(&convert_args(&model, &out, &[]));
    assert!(first.status.success(), "{}", text(&first.stderr));
    let writer = {
        let (model, out) = (model.clone(), out.clone());
        std::thread::spawn(move || {
            for _ in 0..4 {
                let o = run(&convert_args(&model, &out, &["--force"]));
                assert!(o.status.success(), "{}", text(&o.stderr));
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() {
        for rel in ["anemone.json", "chunks/chunk-00.mlpackage/Manifest.json"] {
            let path = out.join(rel);
            if let Err(e) = std::fs::read(&path) {
                panic!("read {} during a replace: {e}", path.display());
            }
        }
        reads += 1;
    }
    writer.join().unwrap();
    assert!(reads > 10, "only {reads} reads");
    assert_eq!(names(dir.path()), ["b"]);
}

fn generate(bundle: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "generate",
        bundle.to_str().unwrap(),
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
        "--temperature",
        "0",
        "--json",
    ];
    args.extend_from_slice(extra);
    anemone(&args)
}

#[test]
fn os_metadata_files_are_ignored_and_named_and_no_verify_skips_the_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let first = run(&convert_args(&fixture("qwen3_gqa4"), &out, &[]));
    assert!(first.status.success(), "{}", text(&first.stderr));
    // what Finder leaves behind on every Mac
    std::fs::write(out.join(".DS_Store"), b"\0\0\0\x01Bud1").unwrap();
    std::fs::write(out.join("._anemone.json"), b"\0\x05\x16\x07").unwrap();
    std::fs::write(out.join("chunks/Icon\r"), b"").unwrap();
    let inspect = anemone(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let report: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let ignored: Vec<&str> = report["ignored_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(ignored, [".DS_Store", "._anemone.json", "chunks/Icon\r"]);
    let text_report = anemone(&["inspect", out.to_str().unwrap()]);
    assert!(text(&text_report.stdout).contains("ignored (OS metadata, not verified)"));
    let g = generate(&out, &[]);
    assert!(g.status.success(), "{}", text(&g.stderr));

    // a file of the user's is not ignored; --no-verify skips the check for who checked already
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();
    let inspect = anemone(&["inspect", out.to_str().unwrap()]);
    assert!(!inspect.status.success());
    assert!(text(&inspect.stderr).contains("notes.txt"));
    let g = generate(&out, &[]);
    assert!(!g.status.success());
    assert!(text(&g.stderr).contains("notes.txt"), "{}", text(&g.stderr));
    let inspect = anemone(&["inspect", out.to_str().unwrap(), "--no-verify"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    assert!(text(&inspect.stdout).contains("not verified (--no-verify)"));
    let g = generate(&out, &["--no-verify"]);
    assert!(g.status.success(), "{}", text(&g.stderr));
}

#[test]
fn inspect_strict_checks_the_manifest_against_every_package_signature() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let first = run(&convert_args(&fixture("qwen3_gqa4"), &out, &[]));
    assert!(first.status.success(), "{}", text(&first.stderr));
    let clean = anemone(&["inspect", out.to_str().unwrap(), "--strict"]);
    assert!(clean.status.success(), "{}", text(&clean.stderr));
    let manifest_path = out.join("anemone.json");
    let original: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(Edit, &str); 3] = [
        (
            |m| {
                let shape = &mut m["chunks"][0]["functions"][0]["states"][0]["shape"][2];
                *shape = serde_json::json!(shape.as_u64().unwrap() + 1);
            },
            "declares states",
        ),
        (
            |m| {
                let states = m["chunks"][0]["functions"][0]["states"].clone();
                m["chunks"][0]["functions"][0]["outputs"][0]["name"] = states[0]["name"].clone();
            },
            "declares outputs",
        ),
        (
            |m| m["chunks"][0]["functions"][0]["inputs"][0]["dtype"] = "fp32".into(),
            "declares inputs",
        ),
    ];
    for (edit, needle) in edits {
        let mut m = original.clone();
        edit(&mut m);
        std::fs::write(&manifest_path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
        let o = anemone(&["inspect", out.to_str().unwrap(), "--strict", "--json"]);
        assert!(!o.status.success(), "{needle}: passed --strict");
        let report = text(&o.stdout);
        assert!(report.contains("manifest-signature"), "{report}");
        assert!(report.contains(needle), "{needle}: {report}");
        // Loading checks it too: generate refuses, naming the package and the disagreement.
        let g = generate(&out, &[]);
        assert!(!g.status.success(), "{needle}: generate loaded the bundle");
        let err = text(&g.stderr);
        assert!(
            err.contains("disagrees with the package") && err.contains("chunk-00.mlpackage"),
            "{needle}: {err}"
        );
        assert!(err.contains(needle), "{needle}: {err}");
    }
}

#[test]
fn gate_plot_into_an_unwritable_place_fails_before_the_gate_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("b");
    let first = run(&convert_args(&fixture("qwen3_gqa4"), &out, &[]));
    assert!(first.status.success(), "{}", text(&first.stderr));
    let plot = dir.path().join("missing-dir/depth.svg");
    let started = Instant::now();
    let o = anemone(&[
        "gate",
        out.to_str().unwrap(),
        "--reference",
        fixture("qwen3_gqa4").to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
        "--json",
    ]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("--plot") && err.contains("missing-dir"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "the gate ran: {}", text(&o.stdout));
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_device_or_fifo_is_not_reported_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.gguf");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for input in [Path::new("/dev/null"), fifo.as_path()] {
        let o = anemone(&[
            "convert",
            input.to_str().unwrap(),
            "--out",
            dir.path().join("b").to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        let err = text(&o.stderr);
        assert!(!err.contains("no such file"), "{err}");
        assert!(err.contains("not a regular file"), "{err}");
    }
}
