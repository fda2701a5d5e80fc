//! `anemone clean`: lists and removes the partial outputs (`.NAME.anemone-partial`) that writers
//! killed before they finished (kill -9, power loss) left beside their targets.

use std::path::PathBuf;

use anemone_mil::staging::{remove_stale, stale_partials};
use anyhow::{Context, Result};
use clap::Args;

/// Remove the partial outputs of interrupted conversions.
///
/// A convert builds its output in `.NAME.anemone-partial` beside `--out` and swaps it in at the
/// end. A writer killed with SIGKILL cannot clean up; the next convert into the same directory
/// removes such debris, and so does this command. Partials of running writers are never touched.
///
/// Examples:
///   anemone clean                 # the current directory
///   anemone clean out/ models/ --dry-run
///   anemone clean out/ --json
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct CleanArgs {
    /// Directories to clean (default: the current directory).
    pub dirs: Vec<PathBuf>,

    /// Only list what would be removed.
    #[arg(long)]
    pub dry_run: bool,

    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: CleanArgs) -> Result<()> {
    let dirs = if args.dirs.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.dirs.clone()
    };
    let mut found = Vec::new();
    for dir in &dirs {
        let paths = if args.dry_run {
            stale_partials(dir)
        } else {
            remove_stale(dir)
        }
        .with_context(|| format!("cleaning {}", dir.display()))?;
        for path in paths {
            let bytes = if args.dry_run { tree_bytes(&path) } else { 0 };
            found.push((path, bytes));
        }
    }
    if args.json {
        let report = serde_json::json!({
            "dry_run": args.dry_run,
            "partials": found.iter().map(|(p, b)| serde_json::json!({
                "path": p, "bytes": if args.dry_run { Some(*b) } else { None },
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if found.is_empty() {
        println!("no partial outputs of interrupted runs");
    }
    for (path, bytes) in &found {
        if args.dry_run {
            println!(
                "would remove {} ({:.1} MB)",
                path.display(),
                *bytes as f64 / 1e6
            );
        } else {
            println!("removed {}", path.display());
        }
    }
    Ok(())
}

/// Bytes of the regular files under `path` (a best effort: unreadable entries count 0).
fn tree_bytes(path: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}
