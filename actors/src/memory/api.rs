//! What callers ask the memory directly: feedback on insights, search of outcomes and the
//! figures of `memory.stats`, each confined to an owner (every owner's for admins: `None`).

use super::*;

/// Most outcomes one search returns.
pub const MAX_SEARCH_LIMIT: usize = 100;

impl Memory {
    /// `memory.feedback`: `score` 1 (helpful), 0 or -1 (wrong) on an insight or outcome of
    /// `scope`'s. A pattern marked wrong twice stops firing.
    pub fn feedback(
        &self,
        scope: Option<&str>,
        target: FeedbackTarget,
        score: i8,
        comment: Option<String>,
    ) -> Result<(), MemoryError> {
        if !(-1..=1).contains(&score) {
            return Err(MemoryError::Invalid {
                field: "score",
                reason: format!("{score} is not -1, 0 or 1"),
            });
        }
        let mine = |owner: &str| scope.is_none_or(|scope| scope == owner);
        let (owner, pattern, insight, outcome) = match target {
            FeedbackTarget::Insight(id) => {
                let interruptions = self.interruptions.lock().unwrap_or_else(|e| e.into_inner());
                match interruptions.get(&id) {
                    Some(Shown { owner, pattern, .. }) if mine(owner) => {
                        (owner.clone(), *pattern, Some(id), None)
                    }
                    _ => return Err(MemoryError::Unknown(format!("i-{id}"))),
                }
            }
            FeedbackTarget::Outcome(id) => {
                let carried = self
                    .interruptions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .find(|(_, shown)| shown.outcome == Some(id) && mine(&shown.owner))
                    .map(|(insight, shown)| (shown.owner.clone(), shown.pattern, Some(*insight)));
                let found =
                    carried.or_else(|| self.failure_pattern(scope, id).map(|(o, p)| (o, p, None)));
                match found {
                    Some((owner, pattern, insight)) => (owner, pattern, insight, Some(id)),
                    None => return Err(MemoryError::Unknown(format!("m-{id}"))),
                }
            }
        };
        let updated = {
            let mut knowledge = self.knowledge.write().unwrap_or_else(|e| e.into_inner());
            knowledge.patterns.get_mut(pattern).map(|record| {
                match score {
                    -1 => record.wrong += 1,
                    1 => record.right += 1,
                    _ => {}
                }
                record.clone()
            })
        };
        self.figures_of(&owner, |figures| match score {
            -1 => figures.feedback.wrong += 1,
            1 => figures.feedback.helpful += 1,
            _ => figures.feedback.neutral += 1,
        });
        if let Some(writer) = &self.writer {
            if let Some(record) = updated {
                writer.send(Write::Pattern(record));
            }
            writer.send(Write::Feedback(FeedbackRecord {
                owner: owner.to_string(),
                insight,
                outcome,
                pattern: Some(pattern),
                score,
                comment,
                at_ms: now_ms(),
            }));
        }
        Ok(())
    }

    /// The owner and pattern of failure `id`, if it is one of `scope`'s.
    fn failure_pattern(&self, scope: Option<&str>, id: i64) -> Option<(Arc<str>, u32)> {
        let mut knowledge = self.knowledge.write().unwrap_or_else(|e| e.into_inner());
        let owners: Vec<Arc<str>> = match scope {
            Some(owner) => vec![owner.into()],
            None => knowledge.index.owners().cloned().collect(),
        };
        owners.into_iter().find_map(|owner| {
            let shelf = knowledge.index.shelf_mut(&owner)?;
            let pattern = shelf.failures.find_mut(id)?.pattern?;
            Some((owner, pattern))
        })
    }

    /// `memory.search`: `scope`'s outcomes whose code is most like `query`, best first. The
    /// ranking comes from memory; the outcomes themselves from the store once it has every
    /// write (when it is there: otherwise what memory holds of them, without their code).
    /// Blocking.
    pub fn search(&self, scope: Option<&str>, query: &str, limit: usize) -> Vec<FoundOutcome> {
        let limit = limit.clamp(1, MAX_SEARCH_LIMIT);
        // Free text: no call signature or size to go by.
        let probe = Probe {
            vector: quantize(&self.embedder.embed(query)),
            calls: 0,
            size: 0,
        };
        let mut ranked: Vec<(f32, i64, Arc<str>, Arc<str>)> = Vec::new();
        {
            let knowledge = self.knowledge.read().unwrap_or_else(|e| e.into_inner());
            for (owner, shelf) in knowledge.index.shelves() {
                if scope.is_some_and(|scope| scope != &**owner) {
                    continue;
                }
                for rows in [&shelf.failures, &shelf.successes] {
                    for (row, score) in rows.scan(&probe, 0.05) {
                        let entry = &rows.entries[row];
                        ranked.push((score, entry.id, owner.clone(), entry.session.clone()));
                    }
                }
            }
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
        ranked.truncate(limit);
        let ids: Vec<i64> = ranked.iter().map(|(_, id, _, _)| *id).collect();
        // What was recorded last may still wait for the store's thread (blocking, briefly).
        self.flush();
        let stored = self.reader.as_ref().and_then(|reader| {
            let mut reader = reader.lock().unwrap_or_else(|e| e.into_inner());
            reader
                .fetch(&ids)
                .map_err(|err| self.health.degrade(&err))
                .ok()
        });
        ranked
            .into_iter()
            .map(|(score, id, owner, session)| {
                let record = stored.as_ref().and_then(|s| s.iter().find(|o| o.id == id));
                FoundOutcome {
                    id: format!("m-{id}"),
                    score: (f64::from(score) * 1000.0).round() / 1000.0,
                    owner: owner.to_string(),
                    session_id: session.to_string(),
                    execution_id: record.map(|o| o.execution_id.clone()),
                    status: record.map(|o| o.status.clone()),
                    code: record.map(|o| o.code.clone()),
                    error: record.and_then(|o| {
                        Some(FoundError {
                            type_name: o.error_type.clone()?,
                            message: o.error_message.clone().unwrap_or_default(),
                            normalized: o.normalized_message.clone().unwrap_or_default(),
                        })
                    }),
                    meta: record.and_then(|o| o.meta.clone()),
                    at_ms: record.map(|o| o.at_ms),
                }
            })
            .collect()
    }

    /// `memory.stats` for `scope` (every owner when `None`).
    pub fn stats(&self, scope: Option<&str>) -> MemoryStats {
        let (failures, successes, patterns, active) = {
            let knowledge = self.knowledge.read().unwrap_or_else(|e| e.into_inner());
            let (failures, successes) = knowledge.index.counts(scope);
            let (patterns, active) = knowledge.patterns.counts(scope);
            (failures, successes, patterns, active)
        };
        let mut total = Figures::default();
        for (owner, figures) in self
            .figures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if scope.is_some_and(|scope| scope != &**owner) {
                continue;
            }
            total.checks += figures.checks;
            total.failing += figures.failing;
            total.interruptions += figures.interruptions;
            total.feedback.helpful += figures.feedback.helpful;
            total.feedback.neutral += figures.feedback.neutral;
            total.feedback.wrong += figures.feedback.wrong;
        }
        MemoryStats {
            enabled: true,
            outcomes: (failures + successes) as u64,
            failures: failures as u64,
            patterns: patterns as u64,
            active_patterns: active as u64,
            checks: total.checks,
            failing_executions: total.failing,
            interruptions: total.interruptions,
            interruption_rate: if total.failing == 0 {
                0.0
            } else {
                total.interruptions as f64 / total.failing as f64
            },
            feedback: total.feedback,
            store: self.store.clone(),
            warning: self.health.warning(),
            embedder: self.embedder.name().to_owned(),
            embedder_errors: self.embedder.errors(),
        }
    }
}
