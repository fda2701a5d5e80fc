//! One module per verb.

pub mod bench;
pub mod bench_peer;
pub mod bisect;
pub mod bisect_child;
pub mod clean;
pub mod compress_opts;
pub mod convert;
pub mod doctor;
pub mod embed;
pub mod gate;
pub mod gate_compare;
pub mod gate_encoder;
pub mod generate;
pub mod inspect;
pub mod inspect_plan;
pub mod serve;

use anemone_runtime::backend::BackendKind;
use clap::builder::{PossibleValuesParser, TypedValueParser};

/// The `--backend` value parser: clap lists (in `--help`) and checks the names of
/// [`BackendKind::ALL`].
fn backend_parser() -> impl TypedValueParser<Value = BackendKind> {
    PossibleValuesParser::new(BackendKind::ALL.map(BackendKind::name))
        .try_map(|name| name.parse::<BackendKind>())
}

/// Core ML's options, shared by the verbs that run bundles (ignored by the executor).
#[derive(Debug, Clone, clap::Args)]
pub struct CoreMlArgs {
    /// Core ML only: the devices it may use: ane (CPU and Neural Engine), gpu (CPU and GPU),
    /// cpu, all.
    #[arg(long, default_value = "ane")]
    pub compute_units: anemone_coreml::ComputeUnits,
    /// Core ML only: compile every package afresh instead of reusing the compiled-model cache
    /// (in the user cache directory, keyed by the package's content hash).
    #[arg(long)]
    pub no_cache: bool,
}

impl CoreMlArgs {
    /// The backend choice of `kind`, `arithmetic` and `threads` with these Core ML options.
    pub fn choice(
        &self,
        kind: BackendKind,
        arithmetic: anemone_runtime::backend::Arithmetic,
        threads: Option<usize>,
    ) -> anemone_runtime::backend::BackendChoice {
        let precision = arithmetic.precision();
        anemone_runtime::backend::BackendChoice {
            threads,
            accumulation: arithmetic.accumulation(),
            compute_units: self.compute_units,
            no_cache: self.no_cache,
            ..anemone_runtime::backend::BackendChoice::new(kind, precision)
        }
    }
}

/// A spinner on stderr with `message`, ticking until cleared.
pub fn spinner(message: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_backend(value: &str) -> Result<BackendKind, clap::Error> {
        let command = clap::Command::new("t").arg(
            clap::Arg::new("backend")
                .long("backend")
                .value_parser(backend_parser()),
        );
        let matches = command.try_get_matches_from(["t", "--backend", value])?;
        Ok(*matches
            .get_one::<BackendKind>("backend")
            .expect("--backend was given"))
    }

    #[test]
    fn backend_flag_takes_every_registered_name_and_lists_them_on_a_miss() {
        for kind in BackendKind::ALL {
            assert_eq!(parse_backend(kind.name()).unwrap(), kind);
        }
        let message = parse_backend("npu").unwrap_err().to_string();
        assert!(message.contains("invalid value 'npu'"), "{message}");
        let names: Vec<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
        let listed = format!("[possible values: {}]", names.join(", "));
        assert!(message.contains(&listed), "{message}");
        // Core ML is a backend name only where Core ML exists
        assert_eq!(
            parse_backend("coreml").is_ok(),
            cfg!(target_vendor = "apple")
        );
    }
}
