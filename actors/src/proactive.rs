//! Proactive computation: predicting a session's next code, running it speculatively in a
//! fork of the worker while the session is idle, and answering from that result when the
//! request arrives, only when a real run would have answered the same.

pub mod budget;
pub mod cache;
pub mod predict;
pub mod predictor;
pub mod schedule;
pub mod stats;
pub mod versions;
