//! One module per verb.

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
