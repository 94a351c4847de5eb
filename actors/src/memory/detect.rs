//! The failure pattern detector: earlier failures of the same owner whose code is similar to
//! the code at hand, grouped by error type and normalised message (the similarity itself
//! stands for the code's shape), counted, weighed against similar code that succeeded, and
//! paired with what worked afterwards in the sessions where they failed.

use std::collections::HashMap;

use super::index::{Entry, Probe, Shelf};
use super::store::PatternRecord;

/// Evidence looked at for what worked afterwards, most similar first.
const MAX_EVIDENCE: usize = 8;
/// Outcomes after a failure searched for the success that followed it.
const FOLLOW_UP_WINDOW: usize = 64;

/// Every owner's failure patterns, by id and by key.
#[derive(Debug, Default)]
pub(crate) struct Patterns {
    list: Vec<PatternRecord>,
    by_key: HashMap<(String, String, String, String), u32>,
}

impl Patterns {
    pub fn from_records(records: Vec<PatternRecord>) -> Self {
        let mut patterns = Self::default();
        for record in records {
            let key = key_of(&record);
            let id = record.id;
            if id as usize != patterns.list.len() {
                continue;
            }
            patterns.list.push(record);
            patterns.by_key.insert(key, id);
        }
        patterns
    }

    /// The pattern of a failure, made if new (`true` then).
    pub fn intern(
        &mut self,
        owner: &str,
        error_type: &str,
        normalized: &str,
        shape: &str,
    ) -> (u32, bool) {
        let key = (
            owner.to_owned(),
            error_type.to_owned(),
            normalized.to_owned(),
            shape.to_owned(),
        );
        if let Some(id) = self.by_key.get(&key) {
            return (*id, false);
        }
        let id = self.list.len() as u32;
        self.list.push(PatternRecord {
            id,
            owner: key.0.clone(),
            error_type: key.1.clone(),
            normalized_message: key.2.clone(),
            shape: key.3.clone(),
            wrong: 0,
            right: 0,
            fired: 0,
        });
        self.by_key.insert(key, id);
        (id, true)
    }

    pub fn get(&self, id: u32) -> Option<&PatternRecord> {
        self.list.get(id as usize)
    }

    pub fn get_mut(&mut self, id: u32) -> Option<&mut PatternRecord> {
        self.list.get_mut(id as usize)
    }

    /// Patterns of `owner` (every owner's when `None`), and how many of them still fire.
    pub fn counts(&self, owner: Option<&str>) -> (usize, usize) {
        let mine = self
            .list
            .iter()
            .filter(|p| owner.is_none_or(|owner| p.owner == owner));
        mine.fold((0, 0), |(all, live), p| {
            (all + 1, live + usize::from(!silenced(p)))
        })
    }
}

fn key_of(record: &PatternRecord) -> (String, String, String, String) {
    (
        record.owner.clone(),
        record.error_type.clone(),
        record.normalized_message.clone(),
        record.shape.clone(),
    )
}

/// A pattern marked wrong twice stops firing.
pub(crate) fn silenced(pattern: &PatternRecord) -> bool {
    pattern.wrong >= 2
}

/// Code at hand as the detector compares it: each statement (line; runs of lines when there
/// are many) with its size, against the statements that failed, and the whole, against the
/// code that worked.
pub(crate) struct Query {
    pub pieces: Vec<Probe>,
    pub whole: Probe,
}

/// A pattern that code at hand seems about to repeat.
#[derive(Debug, Clone)]
pub(crate) struct Finding {
    pub pattern: u32,
    pub confidence: f64,
    pub failures: usize,
    /// Outcome ids of the similar failures, most similar first.
    pub evidence: Vec<i64>,
    pub message: String,
    pub suggestion: Option<String>,
}

/// The patterns `query` (a quantised code vector) matches in `shelf`, surest first.
pub(crate) fn detect(
    shelf: &Shelf,
    patterns: &Patterns,
    query: &Query,
    threshold: f32,
) -> Vec<Finding> {
    let hits: Vec<(usize, f32)> = shelf
        .failures
        .scan_pieces(&query.pieces, threshold)
        .into_iter()
        .map(|(row, similarity, _)| (row, similarity))
        .collect();
    if hits.is_empty() {
        return Vec::new();
    }
    let mut groups: HashMap<(&str, &str), Vec<(usize, f32)>> = HashMap::new();
    for (row, similarity) in hits {
        let entry = &shelf.failures.entries[row];
        let Some(pattern) = entry.pattern.and_then(|id| patterns.get(id)) else {
            continue;
        };
        groups
            .entry((&pattern.error_type, &pattern.normalized_message))
            .or_default()
            .push((row, similarity));
    }
    let successes = shelf.successes.scan(&query.whole, threshold);
    let mut findings: Vec<Finding> = groups
        .into_values()
        .filter_map(|mut members| {
            members.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
            let best = &shelf.failures.entries[members[0].0];
            let pattern = patterns.get(best.pattern?)?;
            if silenced(pattern) {
                return None;
            }
            let failures = members.len() as f64;
            let mean = members.iter().map(|(_, s)| f64::from(*s)).sum::<f64>() / failures;
            // Code that worked counts against the pattern only when it is at least as like
            // the code at hand as the failures are: a fix often looks much like the mistake.
            let against: u32 = successes
                .iter()
                .filter(|(_, similarity)| *similarity >= members[0].1)
                .map(|(row, _)| shelf.successes.entries[*row].repeats)
                .sum();
            let against = f64::from(against);
            let support = failures / (failures + against + 0.25);
            // Similarity past the threshold adds a little: 0.9 at the threshold, 1 when equal.
            let threshold = f64::from(threshold);
            let closeness = 0.9 + 0.1 * (mean - threshold) / (1.0 - threshold).max(1e-6);
            let feedback =
                0.9f64.powi(pattern.wrong as i32) * 1.03f64.powi(pattern.right.min(5) as i32);
            let confidence = (closeness.min(1.0) * support * feedback).min(0.99);
            let evidence: Vec<&Entry> = members
                .iter()
                .map(|(row, _)| &shelf.failures.entries[*row])
                .collect();
            let original = best
                .message
                .as_deref()
                .unwrap_or(&pattern.normalized_message);
            let message = format!(
                "similar code failed {} time{} before with {}: {}",
                members.len(),
                if members.len() == 1 { "" } else { "s" },
                pattern.error_type,
                original
            );
            Some(Finding {
                pattern: pattern.id,
                confidence,
                failures: members.len(),
                suggestion: what_worked(shelf, &evidence),
                evidence: evidence.iter().map(|entry| entry.id).collect(),
                message,
            })
        })
        .collect();
    findings.sort_by(|a, b| b.confidence.total_cmp(&a.confidence));
    findings
}

/// What worked after these failures: the `approach` or code of the next success in each
/// failure's session that read the same names, the most frequent first.
fn what_worked(shelf: &Shelf, failures: &[&Entry]) -> Option<String> {
    let mut votes: Vec<(String, usize)> = Vec::new();
    for failure in failures.iter().take(MAX_EVIDENCE) {
        let from = shelf.successes.after(failure.id);
        let next = shelf.successes.entries[from..]
            .iter()
            .take(FOLLOW_UP_WINDOW)
            .find(|success| {
                success.session == failure.session
                    && (failure.reads.is_empty()
                        || success
                            .reads
                            .iter()
                            .any(|name| failure.reads.contains(name)))
            });
        let Some(next) = next else { continue };
        let suggestion = match (&next.approach, &next.fix) {
            (Some(approach), _) => format!("what worked afterwards: {approach} (m-{})", next.id),
            (None, Some(code)) => format!("what worked afterwards (m-{}):\n{code}", next.id),
            (None, None) => continue,
        };
        match votes
            .iter_mut()
            .find(|(text, _)| text.split(" (m-").next() == suggestion.split(" (m-").next())
        {
            Some((_, count)) => *count += 1,
            None => votes.push((suggestion, 1)),
        }
    }
    votes
        .into_iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.1.cmp(&b.1).then(j.cmp(i)))
        .map(|(_, (text, _))| text)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::memory::index::{quantize, Index};

    fn outcome(id: i64, session: &str, pattern: Option<u32>) -> Entry {
        Entry {
            id,
            session: session.into(),
            size: 4,
            reads: Box::new([]),
            pattern,
            message: None,
            approach: None,
            fix: None,
            code: 7,
            repeats: 1,
        }
    }

    /// The confidence of the one finding for code like the failure, after `successes`
    /// like successes, each from the session `session_of(i)` names.
    fn confidence_after(successes: i64, session_of: impl Fn(i64) -> String) -> f64 {
        let owner: Arc<str> = "alice".into();
        let vector = quantize(&[0.6, 0.8, 0.0, 0.0]);
        let mut patterns = Patterns::default();
        let (pattern, _) = patterns.intern(&owner, "KeyError", "'<name>'", "subscript");
        let mut index = Index::new(4);
        index.insert(&owner, 1, true, &vector, 0, outcome(1, "f", Some(pattern)));
        for id in 2..2 + successes {
            let success = outcome(id, &session_of(id), None);
            index.insert(&owner, id, false, &vector, 0, success);
        }
        let probe = Probe {
            vector,
            calls: 0,
            size: 4,
        };
        let query = Query {
            pieces: vec![probe.clone()],
            whole: probe,
        };
        let findings = detect(index.shelf("alice").unwrap(), &patterns, &query, 0.8);
        assert_eq!(findings.len(), 1);
        findings[0].confidence
    }

    #[test]
    fn folded_repeats_weigh_against_a_pattern_as_often_as_they_ran() {
        let folded = confidence_after(5, |_| "s".into());
        let apart = confidence_after(5, |id| format!("s{id}"));
        let once = confidence_after(1, |_| "s".into());
        assert!((folded - apart).abs() < 1e-9, "{folded} vs {apart}");
        assert!(folded < once, "{folded} vs {once}");
    }
}
