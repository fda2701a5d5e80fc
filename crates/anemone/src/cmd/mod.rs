//! One module per verb.

pub mod clean;
pub mod compress_opts;
pub mod convert;
pub mod gate;
pub mod generate;
pub mod inspect;

use anemone_runtime::backend::BackendKind;
use clap::builder::{PossibleValuesParser, TypedValueParser};

/// The `--backend` value parser: clap lists (in `--help`) and checks the names of
/// [`BackendKind::ALL`].
fn backend_parser() -> impl TypedValueParser<Value = BackendKind> {
    PossibleValuesParser::new(BackendKind::ALL.map(BackendKind::name))
        .try_map(|name| name.parse::<BackendKind>())
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
        let message = parse_backend("coreml").unwrap_err().to_string();
        assert!(message.contains("invalid value 'coreml'"), "{message}");
        assert!(message.contains("[possible values: executor]"), "{message}");
    }
}
