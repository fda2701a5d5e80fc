//! Times anemone's compression of Qwen3-0.6B-shaped decoder blocks and reports the
//! reconstruction error, one JSON object per scheme on stdout.
//!
//! `compress_bench DIR [SCHEME…] [--algorithm optimal|lloyd|lloyd:CELLS:ITERS:TOL] [--only TENSOR]`
//! reads `DIR/<name>.f32` (little-endian f32, written by `benches/compress_vs_coremltools.sh`),
//! or with `DIR/block-NN/` subdirectories one block from each, in turn (only the compression is
//! timed; a block is dropped before the next is read). The error is the relative RMS over all
//! blocks, `sqrt(Σ‖w−ŵ‖² / Σ‖w‖²)`.

use std::time::Instant;

use anemone_compress::{compress_with, CompressOptions, KmeansAlgorithm, Scheme};

/// Projection weights of one Qwen3-0.6B block, `[out, in]`.
const BLOCK: [(&str, usize, usize); 7] = [
    ("q_proj", 2048, 1024),
    ("k_proj", 1024, 1024),
    ("v_proj", 1024, 1024),
    ("o_proj", 1024, 2048),
    ("gate_proj", 3072, 1024),
    ("up_proj", 3072, 1024),
    ("down_proj", 1024, 3072),
];

/// CPU time of this process (all threads), from /proc/self/stat (USER_HZ = 100 on Linux);
/// the machine is shared, so wall time alone says little.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // fields after the parenthesised command name; utime and stime are fields 14 and 15
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok());
    // `rest` starts at field 3 (state)
    match (field(14 - 3), field(15 - 3)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut algorithm = KmeansAlgorithm::default();
    if let Some(i) = args.iter().position(|a| a == "--algorithm") {
        let name = args.get(i + 1).ok_or("--algorithm needs a value")?.clone();
        algorithm = match name.as_str() {
            "optimal" => KmeansAlgorithm::Optimal,
            "lloyd" => KmeansAlgorithm::LLOYD,
            lloyd if lloyd.starts_with("lloyd:") => {
                // lloyd:SEED_CELLS:MAX_ITERS:TOLERANCE
                let mut it = lloyd.split(':').skip(1);
                let mut next = || it.next().ok_or("expected lloyd:SEED_CELLS:ITERS:TOL");
                KmeansAlgorithm::Lloyd {
                    seed_cells_per_cluster: next()?.parse()?,
                    max_iters: next()?.parse()?,
                    tolerance: next()?.parse()?,
                }
            }
            other => return Err(format!("unknown algorithm {other}").into()),
        };
        args.drain(i..i + 2);
    }
    let mut only: Option<String> = None;
    if let Some(i) = args.iter().position(|a| a == "--only") {
        only = Some(args.get(i + 1).ok_or("--only needs a tensor name")?.clone());
        args.drain(i..i + 2);
    }
    let dir = std::path::PathBuf::from(args.first().ok_or("usage: compress_bench DIR [SCHEME…]")?);
    let schemes: Vec<Scheme> = if args.len() > 1 {
        args[1..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![Scheme::int8(), Scheme::kmeans(4), Scheme::kmeans(8)]
    };
    let mut block_dirs: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("block-"))
        })
        .collect();
    block_dirs.sort();
    if block_dirs.is_empty() {
        block_dirs.push(dir.clone());
    }
    let options = CompressOptions {
        importance: None,
        kmeans: algorithm,
    };
    for scheme in schemes {
        let (mut seconds, mut cpu) = (0f64, 0f64);
        let (mut err2, mut ref2, mut max_abs) = (0f64, 0f64, 0f64);
        let (mut bytes, mut applied) = (0usize, std::collections::BTreeSet::new());
        for block_dir in &block_dirs {
            let weights = read_block(block_dir, only.as_deref())?;
            let (start, cpu_start) = (Instant::now(), cpu_seconds());
            let mut compressed = Vec::new();
            for (name, shape, w) in &weights {
                compressed.push(compress_with(name, w, shape, &scheme, &options)?);
            }
            seconds += start.elapsed().as_secs_f64();
            cpu += cpu_seconds() - cpu_start;
            for ((_, _, w), c) in weights.iter().zip(&compressed) {
                let r = c.decompress();
                for (&a, &b) in w.iter().zip(&r) {
                    let d = a as f64 - b as f64;
                    err2 += d * d;
                    ref2 += a as f64 * a as f64;
                    max_abs = max_abs.max(d.abs());
                }
                bytes += c.payload_bytes();
                applied.insert(c.scheme().to_string());
            }
        }
        println!(
            "{}",
            serde_json::json!({
                "tool": "anemone",
                "scheme": scheme.to_string(),
                "applied": applied,
                "blocks": block_dirs.len(),
                "algorithm": format!("{algorithm:?}"),
                "threads": rayon::current_num_threads(),
                "seconds": seconds,
                "cpu_seconds": cpu,
                "relative_rms": (err2 / ref2).sqrt(),
                "max_abs": max_abs,
                "payload_bytes": bytes,
            })
        );
    }
    Ok(())
}

/// The projections of one block in `dir` (all, or the one named `only`).
type Weights = Vec<(String, Vec<usize>, Vec<f32>)>;

fn read_block(
    dir: &std::path::Path,
    only: Option<&str>,
) -> Result<Weights, Box<dyn std::error::Error>> {
    BLOCK
        .iter()
        .filter(|(name, _, _)| only.is_none_or(|o| o == *name))
        .map(|&(name, o, i)| {
            let path = dir.join(format!("{name}.f32"));
            let bytes = std::fs::read(&path)?;
            if bytes.len() != o * i * 4 {
                return Err(format!(
                    "{}: {} bytes, expected {}",
                    path.display(),
                    bytes.len(),
                    o * i * 4
                )
                .into());
            }
            let values = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Ok((name.to_string(), vec![o, i], values))
        })
        .collect()
}
