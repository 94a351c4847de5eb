//! What a session will likely run next, from what it ran and the data it holds.
//!
//! Plain logic, no actors: [`normalise`] gives the cache key of a cell, [`abstract_cell`]
//! turns a cell into a template with the session's names as slots, [`Table`] holds what the
//! training corpus says follows what, [`SessionModel`] turns one session's history and data
//! into ranked [`Prediction`]s, and [`Learned`] tunes them from the outcomes.

mod normal;
mod syntax;
mod template;
mod tokens;

pub use normal::{is_single_expression, normalise};
pub use template::{abstract_cell, instantiate, Filling, Scope, Template};
