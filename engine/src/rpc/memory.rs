//! The `memory.*` methods of docs/protocol.md (check, feedback, search, stats): their params and
//! results, and how each is confined to an owner.
//!
//! `scope` is the owner the dispatcher resolved from the caller and the `owner` param, as for
//! every session method: an owner caller is confined to itself, an admin acts for the owner
//! it names, and an admin who names nobody reaches every owner.

use pyvisor_actors::memory::{FoundOutcome, Insight, MemoryStats};
use serde::{Deserialize, Serialize};

use super::errors::RpcError;
use crate::memory::parse_feedback_target;
use crate::{Engine, Session};

/// Method names.
pub const CHECK: &str = "memory.check";
pub const FEEDBACK: &str = "memory.feedback";
pub const SEARCH: &str = "memory.search";
pub const STATS: &str = "memory.stats";

/// `memory.check` params: the owner by session or by name, and code not yet run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub code: String,
}

/// `memory.check` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checked {
    pub insights: Vec<Insight>,
}

/// `memory.feedback` params: one of `insight_id` (`i-N`) and `outcome_id` (`m-N`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insight_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_id: Option<String>,
    pub score: i8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// `memory.search` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchParams {
    pub query: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// `memory.check`; `session` is the session `session_id` names (looked up within `scope`),
/// whose owner is then the scope.
pub fn check(
    engine: &Engine,
    scope: Option<&str>,
    params: &CheckParams,
    session: Option<&Session>,
) -> Result<Checked, RpcError> {
    const MAX_CODE_BYTES: usize = 1024 * 1024;
    if params.code.len() > MAX_CODE_BYTES {
        return Err(RpcError::invalid_params(format!(
            "code: {} bytes; a check takes at most {MAX_CODE_BYTES}",
            params.code.len()
        )));
    }
    let owner = match session {
        Some(session) => session.owner(),
        None => scope,
    };
    Ok(Checked {
        insights: engine.memory_check(owner, &params.code),
    })
}

pub async fn feedback(
    engine: &Engine,
    scope: Option<&str>,
    params: FeedbackParams,
) -> Result<serde_json::Map<String, serde_json::Value>, RpcError> {
    let (field, id) = match (&params.insight_id, &params.outcome_id) {
        (Some(id), None) => ("insight_id", id),
        (None, Some(id)) => ("outcome_id", id),
        _ => {
            return Err(RpcError::invalid_params(
                "insight_id, outcome_id: exactly one of them is required",
            ))
        }
    };
    let target = parse_feedback_target(id)
        .filter(|target| {
            matches!(target, pyvisor_actors::memory::FeedbackTarget::Insight(_))
                == (field == "insight_id")
        })
        .ok_or_else(|| {
            RpcError::invalid_params(format!("{field}: {id:?} is not an id of that kind"))
        })?;
    if !(-1..=1).contains(&params.score) {
        return Err(RpcError::invalid_params("score: must be -1, 0 or 1"));
    }
    engine
        .memory_feedback(scope, target, params.score, params.comment)
        .await
        .map_err(|err| match err {
            crate::EngineError::Memory(err) => RpcError::invalid_params(format!("{field}: {err}")),
            other => RpcError::from(other),
        })?;
    Ok(serde_json::Map::new())
}

pub async fn search(
    engine: &Engine,
    scope: Option<&str>,
    params: SearchParams,
) -> Result<Vec<FoundOutcome>, RpcError> {
    let limit = params.limit.unwrap_or(10);
    if limit == 0 || limit > 100 {
        return Err(RpcError::invalid_params("limit: must be 1..=100"));
    }
    Ok(engine.memory_search(scope, &params.query, limit).await?)
}

/// `memory.stats`: the counts of `scope`, or of every owner.
pub fn stats(engine: &Engine, scope: Option<&str>) -> MemoryStats {
    engine.memory_stats(scope)
}
