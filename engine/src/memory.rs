//! The memory's part of the embedding API: checks, feedback, search and figures on the
//! [`Engine`], and a check on a [`Session`] for its owner. Every call is confined to one
//! owner (`None` where it says so: every owner, for admins).

mod remote_embedder;

use pyvisor_actors::memory::{FeedbackTarget, FoundOutcome, Insight, MemoryError, MemoryStats};
pub(crate) use remote_embedder::{RemoteEmbedder, RemoteEmbedderError};

use crate::errors::EngineError;
use crate::{Engine, Session};

impl Engine {
    /// Whether the engine remembers outcomes (`[memory] enabled`).
    pub fn memory_enabled(&self) -> bool {
        self.memory_handle().is_some()
    }

    /// The insights `owner`'s `code` would get if it ran now (sessions without an owner
    /// share the owner `""`). Runs against memory only; empty when memory is off.
    pub fn memory_check(&self, owner: Option<&str>, code: &str) -> Vec<Insight> {
        self.memory_handle()
            .map(|memory| memory.check(owner.unwrap_or_default(), code))
            .unwrap_or_default()
    }

    /// Feedback on an insight (`i-N`) or an outcome (`m-N`) of `scope` (any owner's when
    /// `None`): 1 helpful, 0, -1 wrong. A pattern marked wrong twice stops firing.
    pub async fn memory_feedback(
        &self,
        scope: Option<&str>,
        target: FeedbackTarget,
        score: i8,
        comment: Option<String>,
    ) -> Result<(), EngineError> {
        let memory = self.memory_handle().ok_or(EngineError::MemoryDisabled)?;
        Ok(memory.feedback(scope, target, score, comment)?)
    }

    /// Outcomes of `scope` (every owner's when `None`) whose code is most like `query`.
    pub async fn memory_search(
        &self,
        scope: Option<&str>,
        query: &str,
        limit: usize,
    ) -> Result<Vec<FoundOutcome>, EngineError> {
        let memory = self
            .memory_handle()
            .ok_or(EngineError::MemoryDisabled)?
            .clone();
        let (scope, query) = (scope.map(str::to_owned), query.to_owned());
        // The outcomes themselves come from the store: off the async threads.
        tokio::task::spawn_blocking(move || memory.search(scope.as_deref(), &query, limit))
            .await
            .map_err(|_| EngineError::Stopped)
    }

    /// What the memory holds and did, for `scope` (every owner when `None`); all zero with
    /// `enabled: false` when memory is off.
    pub fn memory_stats(&self, scope: Option<&str>) -> MemoryStats {
        self.memory_handle()
            .map(|memory| memory.stats(scope))
            .unwrap_or(MemoryStats {
                enabled: false,
                ..MemoryStats::default()
            })
    }

    /// Waits until everything remembered so far is written to the store.
    pub async fn memory_flush(&self) {
        if let Some(memory) = self.memory_handle().cloned() {
            let _ = tokio::task::spawn_blocking(move || memory.flush()).await;
        }
    }
}

impl Session {
    /// The insights `code` would get in this session's owner's memory if it ran now.
    pub fn memory_check(&self, engine: &Engine, code: &str) -> Vec<Insight> {
        engine.memory_check(self.owner(), code)
    }
}

impl From<MemoryError> for EngineError {
    fn from(err: MemoryError) -> Self {
        EngineError::Memory(err)
    }
}

/// Parses an insight (`i-N`) or outcome (`m-N`) id, as JSON-RPC names them.
#[cfg(feature = "server")]
pub fn parse_feedback_target(id: &str) -> Option<FeedbackTarget> {
    let number = |digits: &str| digits.parse::<i64>().ok().filter(|n| *n > 0);
    if let Some(digits) = id.strip_prefix("i-") {
        return number(digits).map(FeedbackTarget::Insight);
    }
    id.strip_prefix("m-")
        .and_then(number)
        .map(FeedbackTarget::Outcome)
}
