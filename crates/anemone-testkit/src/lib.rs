//! Test helpers shared by the workspace's test suites (unpublished): where the fixtures, real
//! models and package validator are, golden files blessed with `ANEMONE_BLESS=1`, and numeric
//! comparisons in named tolerance tiers whose failures name the worst element.
//!
//! Every helper panics with a message that says what to do (fetch the models, install the
//! validator, bless a golden): these run only inside tests.

pub mod cpu_time;
pub mod golden;
pub mod numeric;
pub mod oracle;
pub mod paths;
pub mod rng;
pub mod validator;

pub use golden::assert_golden;
pub use numeric::{argmax, assert_close, assert_close_scaled, cosine, worst, Tier};
pub use oracle::{oracle_fixtures, OracleFixture};
pub use paths::{
    model, models_dir, oracle_dir, oracle_encoders_root, oracle_root, real_fixture, repo_root,
    tree_bytes,
};
pub use rng::Rng;
pub use validator::{python, run_python, validate, validate_package};
