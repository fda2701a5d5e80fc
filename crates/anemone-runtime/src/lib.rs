//! Generation runtime: the model trait, sampling, chat templates and the generation loop.
pub mod npy;
