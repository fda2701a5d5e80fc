//! Generation runtime: Backend trait, chunked pipeline, sessions, sampling, chat templates.
