//! The engine's CPU budget for speculation: a token bucket of CPU milliseconds.
//!
//! Tokens accrue with wall time at `share` of one core (0.1: 100 ms of CPU per second) up to
//! a burst of a few seconds' worth (more when one child costs more than that burst can pay
//! for: see [`CpuBudget::hold_at_least`]), and are spent by what speculative children really
//! used, from their rusage, after the fact. A speculation is granted at most what the bucket
//! holds, and the worker kills its child when the grant is used up, so the bucket can go below
//! zero only by the little a child runs before it is killed; it then refills before the next
//! grant.

use std::time::Instant;

/// Seconds of accrual the bucket holds at most.
const BURST_SECONDS: f64 = 2.0;
/// No speculation is started with less than this many milliseconds to spend.
pub const MIN_GRANT_MS: f64 = 10.0;

/// A token bucket of CPU milliseconds.
#[derive(Debug, Clone)]
pub struct CpuBudget {
    /// CPU milliseconds earned per second of wall time.
    rate_ms_per_s: f64,
    /// What the bucket holds at most unless a child needs more: `BURST_SECONDS` of accrual.
    burst_ms: f64,
    capacity_ms: f64,
    tokens_ms: f64,
    refilled_at: Instant,
    spent_ms: f64,
}

impl CpuBudget {
    /// A bucket earning `share` of one core, full at `now`.
    pub fn new(share: f64, now: Instant) -> Self {
        let rate_ms_per_s = share.max(0.0) * 1000.0;
        let burst_ms = (rate_ms_per_s * BURST_SECONDS).max(MIN_GRANT_MS);
        Self {
            rate_ms_per_s,
            burst_ms,
            capacity_ms: burst_ms,
            tokens_ms: if share > 0.0 { burst_ms } else { 0.0 },
            refilled_at: now,
            spent_ms: 0.0,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens_ms = (self.tokens_ms + elapsed * self.rate_ms_per_s).min(self.capacity_ms);
        self.refilled_at = now;
    }

    /// CPU milliseconds a speculation started at `now` may use, at most `want`; `None` when
    /// the bucket holds less than [`MIN_GRANT_MS`].
    pub fn grant(&mut self, now: Instant, want: f64) -> Option<f64> {
        self.refill(now);
        if self.rate_ms_per_s <= 0.0 || self.tokens_ms < MIN_GRANT_MS {
            return None;
        }
        Some(self.tokens_ms.min(want.max(MIN_GRANT_MS)))
    }

    /// Lets the bucket hold at least `ms` (never less than its burst): a speculation that
    /// cannot be worth its child with less would otherwise wait for ever on a machine where
    /// children cost more. Tokens still accrue at the same share, so only the burst grows.
    pub fn hold_at_least(&mut self, ms: f64) {
        self.capacity_ms = self.burst_ms.max(ms);
    }

    /// The most the bucket can hold, and so the largest grant.
    pub fn capacity_ms(&self) -> f64 {
        self.capacity_ms
    }

    /// A speculative child used `cpu_ms` of CPU time.
    pub fn spend(&mut self, now: Instant, cpu_ms: f64) {
        self.refill(now);
        let cpu_ms = cpu_ms.max(0.0);
        self.tokens_ms -= cpu_ms;
        self.spent_ms += cpu_ms;
    }

    /// All the CPU milliseconds spent so far.
    pub fn spent_ms(&self) -> f64 {
        self.spent_ms
    }
}

/// What a speculation's child costs beyond its snippets: the fork, the copy-on-write faults
/// its first snippet takes, the worker taking back its pages. Learned from children that ran
/// to their end (a moving average of their CPU less their snippets'), so that a plan leaves
/// room for it in its grant rather than being killed before its last snippets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChildOverhead {
    ms: f64,
}

/// What a child is assumed to cost before one has ended: a 70 MB worker's, measured.
const FIRST_OVERHEAD_MS: f64 = 10.0;
/// Weight of the newest child in the average.
const OVERHEAD_WEIGHT: f64 = 0.2;

impl Default for ChildOverhead {
    fn default() -> Self {
        Self {
            ms: FIRST_OVERHEAD_MS,
        }
    }
}

impl ChildOverhead {
    /// CPU milliseconds the next child is expected to cost beyond its snippets.
    pub fn ms(&self) -> f64 {
        self.ms
    }

    /// A child that ran all it was given used `child_ms`, its snippets `snippets_ms`.
    pub fn observe(&mut self, child_ms: f64, snippets_ms: f64) {
        let sample = (child_ms - snippets_ms).clamp(0.0, child_ms.max(0.0));
        self.ms += OVERHEAD_WEIGHT * (sample - self.ms);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn spending_never_passes_the_share_over_a_long_run() {
        let start = Instant::now();
        let mut budget = CpuBudget::new(0.1, start);
        let mut now = start;
        // A greedy scheduler that asks every 10 ms and always uses all it is given.
        for _ in 0..6000 {
            now += Duration::from_millis(10);
            if let Some(granted) = budget.grant(now, 1000.0) {
                budget.spend(now, granted);
            }
        }
        let wall_ms = now.duration_since(start).as_secs_f64() * 1000.0;
        let share = budget.spent_ms() / wall_ms;
        // The burst lets it start a little ahead; over a minute that is under 0.4 points.
        assert!(share <= 0.1 + 200.0 / wall_ms + 1e-9, "share {share}");
        assert!(share > 0.09, "a greedy scheduler uses the budget: {share}");
    }

    #[test]
    fn overspending_waits_for_the_refill() {
        let now = Instant::now();
        let mut budget = CpuBudget::new(0.1, now);
        budget.spend(now, 500.0); // a child ran past its grant before it was killed
        assert_eq!(budget.grant(now, 50.0), None);
        assert_eq!(budget.grant(now + Duration::from_secs(2), 50.0), None);
        let later = now + Duration::from_secs(4);
        assert!(budget.grant(later, 50.0).is_some());
    }

    #[test]
    fn a_zero_share_grants_nothing() {
        let now = Instant::now();
        let mut budget = CpuBudget::new(0.0, now);
        assert_eq!(budget.grant(now + Duration::from_secs(60), 10.0), None);
    }

    #[test]
    fn a_grant_is_capped_by_what_is_asked_and_what_is_held() {
        let now = Instant::now();
        let mut budget = CpuBudget::new(0.1, now);
        assert_eq!(budget.grant(now, 30.0), Some(30.0));
        assert_eq!(budget.grant(now, 5000.0), Some(200.0));
    }

    #[test]
    fn the_bucket_grows_to_hold_a_costly_child_and_shrinks_back() {
        let start = Instant::now();
        let mut budget = CpuBudget::new(0.1, start);
        budget.spend(start, 200.0);
        budget.hold_at_least(320.0);
        let later = start + Duration::from_secs(10);
        assert_eq!(budget.grant(later, 5000.0), Some(320.0));
        budget.spend(later, 320.0);
        budget.hold_at_least(50.0); // children became cheap again: the burst is two seconds
        assert_eq!(
            budget.grant(later + Duration::from_secs(10), 5000.0),
            Some(200.0)
        );
    }

    #[test]
    fn the_overhead_of_a_child_follows_what_children_cost_beyond_their_snippets() {
        let mut overhead = ChildOverhead::default();
        assert_eq!(overhead.ms(), FIRST_OVERHEAD_MS);
        for _ in 0..40 {
            overhead.observe(30.0, 26.0);
        }
        assert!((overhead.ms() - 4.0).abs() < 0.01, "{overhead:?}");
        overhead.observe(5.0, 9.0); // snippets' clocks ahead of the child's: no negative cost
        assert!(overhead.ms() > 3.0 && overhead.ms() < 4.0, "{overhead:?}");
    }
}
