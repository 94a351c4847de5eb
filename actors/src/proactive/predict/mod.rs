//! What a session will likely run next, from what it ran and the data it holds.
//!
//! Plain logic, no actors: [`normalise`] gives the cache key of a cell, [`abstract_cell`]
//! turns a cell into a template with the session's names as slots, [`Table`] holds what the
//! training corpus says follows what, [`SessionModel`] turns one session's history and data
//! into ranked [`Prediction`]s, and [`Learned`] tunes them from the outcomes.

mod candidates;
mod chain;
mod edits;
mod evaluate;
mod history;
mod learn;
mod learned;
mod literals;
mod model;
mod normal;
pub mod offline;
mod prediction;
mod rank;
#[cfg(test)]
mod scenarios;
mod syntax;
mod table;
mod template;
mod tokens;
mod train;
mod varied;

pub use candidates::Candidate;
pub use edits::Edits;
pub use evaluate::{evaluate, Coverage};
pub use learn::{Limits, TableBuilder};
pub use learned::Learned;
pub use model::{Context, Observed, SessionModel};
pub use normal::{is_single_expression, mentions_any, normalise};
pub use prediction::{Prediction, Source, MIN_COST_MS};
pub use rank::{Features, Ranker, FEATURES, FEATURE_NAMES};
pub use table::{Followers, Rate, Table};
pub use template::{abstract_cell, instantiate, Filling, Scope, Template};
pub use train::{folds_by_repository, train};
