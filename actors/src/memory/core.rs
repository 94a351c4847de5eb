//! The memory's working part: recording outcomes into the index, and the checks (with and
//! without the interruption policy). Opening the store and loading from it: `loading`.

use super::*;

impl Memory {
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// Takes in an execution that ended; returns its outcome id. Only memory is touched here:
    /// the store gets it later, on its own thread.
    pub fn record(&self, draft: OutcomeDraft) -> i64 {
        let id = self.next_outcome.fetch_add(1, Ordering::Relaxed);
        let at_ms = now_ms();
        let failure = is_failure(draft.status, draft.error.as_ref());
        let vector = quantize(&self.embedder.embed(indexed_text(
            &draft.code,
            failure,
            draft.failing_line,
        )));
        let normalized = draft.error.as_ref().map(|(_, m)| normalize_message(m));
        let record = OutcomeRecord {
            id,
            owner: draft.owner.to_string(),
            session_id: draft.session_id.to_string(),
            execution_id: draft.execution_id.clone(),
            at_ms,
            code: draft.code,
            status: draft.status.as_str().to_owned(),
            error_type: draft.error.as_ref().map(|(t, _)| t.clone()),
            error_message: draft.error.map(|(_, m)| m),
            normalized_message: normalized,
            duration_ms: draft.duration_ms,
            reads: Vec::new(),
            meta: draft.meta,
            failing_line: draft.failing_line,
            vector,
            embedder: self.embedder.name().to_owned(),
        };
        let mut writes = Vec::with_capacity(3);
        {
            let mut knowledge = self.knowledge.write().unwrap_or_else(|e| e.into_inner());
            if let Some(pattern) = knowledge.take_in(&record, self.embedder.as_ref()) {
                writes.push(Write::Pattern(pattern));
            }
            let over = knowledge.index.len() > self.config.max_outcomes as usize + PRUNE_SLACK;
            let aged = self.config.max_age.is_some() && id % 1024 == 0;
            if over || aged {
                let before_ms = self
                    .config
                    .max_age
                    .map(|age| at_ms - age.as_millis() as i64);
                knowledge
                    .index
                    .prune(self.config.max_outcomes as usize, before_ms);
                writes.push(Write::Prune {
                    max: self.config.max_outcomes,
                    before_ms,
                });
            }
        }
        let (before, carried) = {
            let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
            let policy = sessions.get(&draft.session_id);
            (
                policy.and_then(|p| p.interruption_before(draft.execution_count)),
                policy.and_then(|p| p.carried(draft.execution_count)),
            )
        };
        if let Some(interruption) = carried {
            // For feedback given by the outcome id of the execution that carried it.
            if let Some(entry) = self
                .interruptions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&interruption)
            {
                entry.outcome = Some(id);
            }
        }
        {
            if let Some(interruption) = before {
                writes.push(Write::NextStatus {
                    interruption,
                    status: draft.status.as_str().to_owned(),
                });
            }
        }
        self.remember_recent(&draft.session_id, &draft.execution_id, &draft.owner, id);
        if failure {
            self.figures_of(&draft.owner, |figures| figures.failing += 1);
        }
        counter!(OUTCOMES_TOTAL, "status" => draft.status.as_str()).increment(1);
        writes.insert(0, Write::Outcome(Box::new(record)));
        if let Some(writer) = &self.writer {
            for write in writes {
                writer.send(write);
            }
        }
        id
    }

    /// The names execution `execution_id` of `session_id` read, reported after its result.
    pub fn attach_reads(&self, session_id: &str, execution_id: &str, reads: &[String]) {
        let key: (Arc<str>, String) = (session_id.into(), execution_id.to_owned());
        let Some((owner, id)) = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .get(&key)
            .cloned()
        else {
            return;
        };
        {
            let mut knowledge = self.knowledge.write().unwrap_or_else(|e| e.into_inner());
            let Some(shelf) = knowledge.index.shelf_mut(&owner) else {
                return;
            };
            let entry = match shelf.failures.find_mut(id) {
                Some(entry) => Some(entry),
                None => shelf.successes.find_mut(id),
            };
            if let Some(entry) = entry {
                entry.reads = hash_names(reads);
            }
        }
        if let Some(writer) = &self.writer {
            writer.send(Write::Reads {
                id,
                reads: reads.to_vec(),
            });
        }
    }

    /// The insight execution number `execution_count` of a session may carry, under the
    /// interruption policy: checked against the in-memory index before the code runs, and
    /// recorded as an interruption when one is shown.
    pub fn interrupt(
        &self,
        owner: &Arc<str>,
        session_id: &Arc<str>,
        execution_id: &str,
        execution_count: u64,
        code: &str,
    ) -> Vec<Insight> {
        let policy = &self.config.policy;
        let open = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(session_id)
            .cloned()
            .unwrap_or_default()
            .open(policy, execution_count);
        if !open {
            return Vec::new();
        }
        let findings = self.findings(owner, code);
        let Some(best) = findings
            .into_iter()
            .find(|finding| policy.convincing(finding.confidence, finding.failures))
        else {
            return Vec::new();
        };
        let id = self.next_interruption.fetch_add(1, Ordering::Relaxed);
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(session_id.clone())
            .or_default()
            .shown(execution_count, id);
        let pattern = {
            let mut knowledge = self.knowledge.write().unwrap_or_else(|e| e.into_inner());
            knowledge.patterns.get_mut(best.pattern).map(|pattern| {
                pattern.fired += 1;
                pattern.clone()
            })
        };
        self.interruptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                Shown {
                    owner: owner.clone(),
                    pattern: best.pattern,
                    outcome: None,
                },
            );
        self.figures_of(owner, |figures| figures.interruptions += 1);
        counter!(INTERRUPTIONS_TOTAL).increment(1);
        if let Some(writer) = &self.writer {
            if let Some(pattern) = pattern {
                writer.send(Write::Pattern(pattern));
            }
            writer.send(Write::Interruption(InterruptionRecord {
                id,
                owner: owner.to_string(),
                session_id: session_id.to_string(),
                execution_id: execution_id.to_owned(),
                pattern: best.pattern,
                confidence: best.confidence,
                message: best.message.clone(),
                suggestion: best.suggestion.clone(),
                at_ms: now_ms(),
            }));
        }
        vec![insight(format!("i-{id}"), best)]
    }

    /// `memory.check`: the insights `owner`'s code would get, for code not yet run. Not
    /// limited by a session's budget or spacing, and not recorded as an interruption.
    pub fn check(&self, owner: &str, code: &str) -> Vec<Insight> {
        self.figures_of(&Arc::from(owner), |figures| figures.checks += 1);
        let policy = &self.config.policy;
        self.findings(owner, code)
            .into_iter()
            .filter(|finding| policy.convincing(finding.confidence, finding.failures))
            .map(|finding| insight(format!("p-{}", finding.pattern), finding))
            .collect()
    }

    /// Patterns `owner`'s `code` matches, surest first, from memory only.
    fn findings(&self, owner: &str, code: &str) -> Vec<detect::Finding> {
        let started = Instant::now();
        let has_failures = |knowledge: &Knowledge| {
            knowledge
                .index
                .shelf(owner)
                .is_some_and(|shelf| !shelf.failures.entries.is_empty())
        };
        if !has_failures(&self.knowledge.read().unwrap_or_else(|e| e.into_inner())) {
            return Vec::new();
        }
        // Embedded outside the lock, in one batch: an embedder may be a remote service.
        let pieces = statements::pieces(code);
        let texts: Vec<&str> = pieces.iter().map(String::as_str).chain([code]).collect();
        let mut probes: Vec<Probe> = texts
            .iter()
            .zip(self.embedder.embed_batch(&texts))
            .map(|(text, vector)| Probe {
                vector: quantize(&vector),
                calls: call_signature(text),
                size: code_size(text),
            })
            .collect();
        let whole = probes.pop().expect("the whole code is always probed");
        let query = Query {
            pieces: probes,
            whole,
        };
        let knowledge = self.knowledge.read().unwrap_or_else(|e| e.into_inner());
        let Some(shelf) = knowledge.index.shelf(owner) else {
            return Vec::new();
        };
        let found = detect(
            shelf,
            &knowledge.patterns,
            &query,
            self.config.threshold as f32,
        );
        histogram!(CHECK_SECONDS).record(started.elapsed().as_secs_f64());
        found
    }

    /// The session is closed: what the policy knew of it goes.
    pub fn forget_session(&self, session_id: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session_id);
        let mut knowledge = self.knowledge.write().unwrap_or_else(|e| e.into_inner());
        knowledge.last_failed.remove(session_id);
        knowledge.index.forget_session(session_id);
    }

    /// Waits until everything recorded so far is in the store (or lost, with a warning).
    pub fn flush(&self) {
        if let Some(writer) = &self.writer {
            writer.flush();
        }
    }

    /// Why memory works without (part of) its store, if it does.
    pub fn warning(&self) -> Option<String> {
        self.health.warning()
    }

    fn remember_recent(
        &self,
        session_id: &Arc<str>,
        execution_id: &str,
        owner: &Arc<str>,
        id: i64,
    ) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let key = (session_id.clone(), execution_id.to_owned());
        recent.by_key.insert(key.clone(), (owner.clone(), id));
        recent.order.push_back(key);
        if recent.order.len() > RECENT {
            if let Some(old) = recent.order.pop_front() {
                recent.by_key.remove(&old);
            }
        }
    }

    pub(super) fn figures_of(&self, owner: &Arc<str>, change: impl FnOnce(&mut Figures)) {
        let mut figures = self.figures.lock().unwrap_or_else(|e| e.into_inner());
        change(figures.entry(owner.clone()).or_default());
    }
}

impl Knowledge {
    /// Adds a stored or new outcome to the index; returns its pattern when it made a new one.
    pub(super) fn take_in(
        &mut self,
        outcome: &OutcomeRecord,
        embedder: &dyn Embedder,
    ) -> Option<PatternRecord> {
        let (status, error, failure) = stored_status(outcome);
        let session: Arc<str> = outcome.session_id.as_str().into();
        let followed_failure = match status {
            ExecutionStatus::Ok | ExecutionStatus::Error | ExecutionStatus::Timeout => {
                self.last_failed.insert(session.clone(), failure) == Some(true)
            }
            _ => false,
        };
        if !(failure || status == ExecutionStatus::Ok) {
            return None;
        }
        let mut new_pattern = None;
        let pattern = failure.then(|| {
            let (type_name, message) = error.clone().unwrap_or_default();
            let normalized = outcome
                .normalized_message
                .clone()
                .unwrap_or_else(|| normalize_message(&message));
            let shape = code_shape(&outcome.code).join(",");
            let (id, new) = self
                .patterns
                .intern(&outcome.owner, &type_name, &normalized, &shape);
            if new {
                new_pattern = self.patterns.get(id).cloned();
            }
            id
        });
        let indexed = indexed_text(&outcome.code, failure, outcome.failing_line);
        let vector = if outcome.embedder == embedder.name()
            && outcome.vector.len() == embedder.dims()
        {
            outcome.vector.clone()
        } else {
            quantize(&embedder.embed(indexed_text(&outcome.code, failure, outcome.failing_line)))
        };
        let reads = if outcome.reads.is_empty() {
            mentioned_names(&outcome.code)
        } else {
            outcome.reads.clone()
        };
        let entry = Entry {
            id: outcome.id,
            session,
            size: code_size(indexed),
            reads: hash_names(&reads),
            pattern,
            message: error.map(|(_, message)| capped(&message, MAX_MESSAGE_CHARS)),
            approach: outcome
                .meta
                .as_ref()
                .and_then(|meta| meta.approach.as_deref())
                .map(Arc::from),
            fix: (!failure && followed_failure).then(|| capped(&outcome.code, MAX_FIX_CHARS)),
            code: xxh3_64(outcome.code.as_bytes()),
            repeats: 1,
        };
        let owner: Arc<str> = outcome.owner.as_str().into();
        self.index.insert(
            &owner,
            outcome.at_ms,
            failure,
            &vector,
            call_signature(indexed),
            entry,
        );
        new_pattern
    }
}

/// A stored outcome's status, its error (type and message), and whether it counts as a
/// failure.
pub(super) fn stored_status(
    outcome: &OutcomeRecord,
) -> (ExecutionStatus, Option<(String, String)>, bool) {
    let status = match outcome.status.as_str() {
        "ok" => ExecutionStatus::Ok,
        "error" => ExecutionStatus::Error,
        "timeout" => ExecutionStatus::Timeout,
        "crashed" => ExecutionStatus::Crashed,
        _ => ExecutionStatus::Interrupted,
    };
    let error = outcome
        .error_type
        .clone()
        .zip(outcome.error_message.clone());
    let failure = is_failure(status, error.as_ref());
    (status, error, failure)
}

/// Whether an execution that ended so is a failure worth remembering: the code raised, ran
/// out of time or killed its worker (not: it was interrupted, or never ran).
fn is_failure(status: ExecutionStatus, error: Option<&(String, String)>) -> bool {
    let never_ran = error.is_some_and(|(type_name, _)| {
        matches!(
            type_name.as_str(),
            "NotExecuted" | "StateLost" | "SessionClosed"
        )
    });
    matches!(
        status,
        ExecutionStatus::Error | ExecutionStatus::Timeout | ExecutionStatus::Crashed
    ) && !never_ran
}

fn insight(id: String, finding: detect::Finding) -> Insight {
    Insight {
        id,
        kind: "failure_pattern".to_owned(),
        confidence: (finding.confidence * 1000.0).round() / 1000.0,
        message: finding.message,
        suggestion: finding.suggestion,
        evidence: finding
            .evidence
            .iter()
            .map(|id| format!("m-{id}"))
            .collect(),
    }
}

/// What the index holds a vector of: the statement that raised, for a failure whose failing
/// line is known, else the whole code.
pub(super) fn indexed_text(code: &str, failure: bool, failing_line: Option<u32>) -> &str {
    failing_line
        .filter(|_| failure)
        .and_then(|line| statements::statement_at(code, line))
        .unwrap_or(code)
}

/// Tokens in `code`, the measure of its size that similarity goes with.
fn code_size(code: &str) -> u32 {
    embed::tokenize(code).len().try_into().unwrap_or(u32::MAX)
}

fn hash_names(names: &[String]) -> Box<[u64]> {
    names.iter().map(|name| xxh3_64(name.as_bytes())).collect()
}

fn capped(text: &str, max_chars: usize) -> Arc<str> {
    match text.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &text[..at]).into(),
        None => text.into(),
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
