//! The interruption policy: which of the patterns a check found may interrupt a session's
//! caller, so that insights come rarely and only when they are likely right.

/// The policy's settings (`[memory]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyConfig {
    /// Least confidence of an insight.
    pub confidence: f64,
    /// Least earlier failures in its pattern.
    pub min_failures: u32,
    /// Most insights one session gets.
    pub budget: u32,
    /// Least executions between two insights of a session.
    pub spacing: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            confidence: 0.8,
            min_failures: 2,
            budget: 5,
            spacing: 3,
        }
    }
}

impl PolicyConfig {
    /// Whether a pattern of `failures` failures found with `confidence` is worth telling.
    pub fn convincing(&self, confidence: f64, failures: usize) -> bool {
        confidence >= self.confidence && failures >= self.min_failures as usize
    }
}

/// What one session has been shown.
#[derive(Debug, Default, Clone)]
pub(crate) struct SessionPolicy {
    shown: u32,
    /// The execution count of the last insight shown, and the interruption's id.
    last: Option<(u64, i64)>,
}

impl SessionPolicy {
    /// Whether execution number `count` (from 1) of the session may carry an insight.
    pub fn open(&self, config: &PolicyConfig, count: u64) -> bool {
        let had_one_before = count >= 2;
        let within_budget = self.shown < config.budget;
        let spaced = self
            .last
            .is_none_or(|(at, _)| count.saturating_sub(at) >= u64::from(config.spacing));
        had_one_before && within_budget && spaced
    }

    /// Execution `count` carried interruption `id`.
    pub fn shown(&mut self, count: u64, id: i64) {
        self.shown += 1;
        self.last = Some((count, id));
    }

    /// The interruption execution `count` carried, if any.
    pub fn carried(&self, count: u64) -> Option<i64> {
        self.last.filter(|(at, _)| *at == count).map(|(_, id)| id)
    }

    /// The interruption execution `count` follows directly, if any.
    pub fn interruption_before(&self, count: u64) -> Option<i64> {
        self.last
            .filter(|(at, _)| at + 1 == count)
            .map(|(_, id)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_spacing_and_first_execution() {
        let config = PolicyConfig {
            budget: 2,
            spacing: 3,
            ..PolicyConfig::default()
        };
        let mut session = SessionPolicy::default();
        assert!(
            !session.open(&config, 1),
            "no insight on the first execution"
        );
        assert!(session.open(&config, 2));
        session.shown(2, 1);
        assert!(!session.open(&config, 3));
        assert!(!session.open(&config, 4));
        assert!(session.open(&config, 5));
        session.shown(5, 2);
        assert!(!session.open(&config, 9), "budget spent");
        assert_eq!(session.interruption_before(6), Some(2));
        assert!(config.convincing(0.85, 2));
        assert!(!config.convincing(0.85, 1));
        assert!(!config.convincing(0.79, 5));
    }
}
