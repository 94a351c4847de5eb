//! [`BudgetController`]: what one task loop may still spend (dollars, model replies, nesting),
//! kept by the host. Every completion of the loop, of its sessions' `llm_query` and
//! `llm_query_batched`, and of its nested loops is charged here and to every loop above it;
//! a nested loop is given a share of its parent's remaining cost and iterations, and its
//! replies count against what its parent has left. Session code never holds any of this: its
//! calls carry no budget, so it cannot raise one.

use std::sync::{Arc, Mutex};

use super::Budget;
use crate::config::RlmConfig;
use crate::llm::{Completion, Usage};

/// One loop's budget; shared by the loop and its session's bridge.
#[derive(Debug)]
pub struct BudgetController {
    depth: u32,
    max_depth: u32,
    max_cost: Option<f64>,
    max_iterations: u32,
    parent: Option<Arc<BudgetController>>,
    spent: Mutex<Spent>,
}

/// What a loop has used so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Spent {
    /// Dollars, its nested loops' and its sessions' calls included.
    pub cost: f64,
    /// Tokens, likewise.
    pub tokens: Usage,
    /// The loop's own model replies.
    pub iterations: u32,
    /// Model replies of the loops nested in it.
    pub nested_iterations: u32,
}

/// What a nested loop is given, or why `rlm_query` runs as `llm_query` instead.
pub type Allotment = Result<Arc<BudgetController>, String>;

impl BudgetController {
    /// The budget of a task's top loop: `budget`'s limits, else the defaults of `config`.
    pub fn root(budget: &Budget, config: &RlmConfig) -> Arc<Self> {
        Arc::new(Self {
            depth: 0,
            max_depth: budget.max_depth.unwrap_or(config.max_depth),
            max_cost: budget.max_cost,
            max_iterations: budget.max_iterations.unwrap_or(config.max_iterations),
            parent: None,
            spent: Mutex::new(Spent::default()),
        })
    }

    /// The loop's nesting: 0 for a task's top loop.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    pub fn max_depth(&self) -> u32 {
        self.max_depth
    }

    /// The dollars the loop was given; `None` for no limit.
    pub fn max_cost(&self) -> Option<f64> {
        self.max_cost
    }

    /// The model replies the loop was given.
    pub fn max_iterations(&self) -> u32 {
        self.max_iterations
    }

    /// What the loop has used so far.
    pub fn spent(&self) -> Spent {
        *self.spent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Dollars left, for this loop and every loop above it; `None` for no limit.
    pub fn remaining_cost(&self) -> Option<f64> {
        let own = (self.max_cost).map(|max| (max - self.spent().cost).max(0.0));
        let above = self.parent.as_ref().and_then(|p| p.remaining_cost());
        match (own, above) {
            (Some(own), Some(above)) => Some(own.min(above)),
            (own, above) => own.or(above),
        }
    }

    /// Model replies left, for this loop and every loop above it.
    pub fn remaining_iterations(&self) -> u32 {
        let spent = self.spent();
        let own = (self.max_iterations).saturating_sub(spent.iterations + spent.nested_iterations);
        match &self.parent {
            Some(parent) => own.min(parent.remaining_iterations()),
            None => own,
        }
    }

    /// Whether the dollars are used up.
    pub fn cost_exhausted(&self) -> bool {
        self.remaining_cost().is_some_and(|left| left <= 0.0)
    }

    /// Refuses a call once the dollars are used up; the message says why.
    pub fn admit(&self) -> Result<(), String> {
        match self.remaining_cost() {
            Some(left) if left <= 0.0 => Err(format!(
                "the budget of this loop (depth {}) is spent: ${:.4} of ${:.4}",
                self.depth,
                self.spent().cost,
                self.max_cost.or(self.parent_max()).unwrap_or_default()
            )),
            _ => Ok(()),
        }
    }

    fn parent_max(&self) -> Option<f64> {
        self.parent
            .as_ref()
            .and_then(|p| p.max_cost.or(p.parent_max()))
    }

    /// Charges one completion to this loop and every loop above it.
    pub fn charge(&self, completion: &Completion) {
        self.walk(|spent| {
            spent.cost += completion.cost;
            spent.tokens += completion.usage;
        });
    }

    /// Counts one model reply of this loop, and a nested one in every loop above it.
    pub fn count_iteration(&self) {
        self.spent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iterations += 1;
        let mut above = self.parent.clone();
        while let Some(parent) = above {
            parent
                .spent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .nested_iterations += 1;
            above = parent.parent.clone();
        }
    }

    fn walk(&self, mut change: impl FnMut(&mut Spent)) {
        change(&mut self.spent.lock().unwrap_or_else(|e| e.into_inner()));
        let mut above = self.parent.clone();
        while let Some(parent) = above {
            change(&mut parent.spent.lock().unwrap_or_else(|e| e.into_inner()));
            above = parent.parent.clone();
        }
    }

    /// The budget of a loop nested one level below this one: `config.sub_share` of what this
    /// one has left. `Err` says why there is none (the depth is at its maximum, or less than
    /// `config`'s thresholds is left), and `rlm_query` then runs as `llm_query`.
    pub fn nested(self: &Arc<Self>, config: &RlmConfig) -> Allotment {
        if self.depth >= self.max_depth {
            return Err(format!(
                "depth {} is the maximum (max_depth {})",
                self.depth + 1,
                self.max_depth
            ));
        }
        let cost = self.remaining_cost();
        if let Some(left) = cost.filter(|left| *left < config.downgrade_below_cost) {
            return Err(format!(
                "${left:.4} left, under ${:.2}",
                config.downgrade_below_cost
            ));
        }
        let iterations = self.remaining_iterations();
        if iterations < config.downgrade_below_iterations {
            return Err(format!(
                "{iterations} iteration(s) left, under {}",
                config.downgrade_below_iterations
            ));
        }
        let share = config.sub_share;
        Ok(Arc::new(Self {
            depth: self.depth + 1,
            max_depth: self.max_depth,
            max_cost: cost.map(|left| left * share),
            max_iterations: ((f64::from(iterations) * share).floor() as u32).max(1),
            parent: Some(self.clone()),
            spent: Mutex::new(Spent::default()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn completion(cost: f64) -> Completion {
        Completion {
            text: String::new(),
            model: "m".into(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
            },
            cost,
            attempts: 1,
            duration: Duration::ZERO,
        }
    }

    fn budget(max_cost: f64, max_iterations: u32, max_depth: u32) -> Budget {
        Budget {
            max_cost: Some(max_cost),
            max_iterations: Some(max_iterations),
            max_depth: Some(max_depth),
        }
    }

    #[test]
    fn a_nested_loop_gets_half_of_what_is_left_and_charges_every_loop_above() {
        let config = RlmConfig::default();
        let root = BudgetController::root(&budget(4.0, 40, 2), &config);
        root.charge(&completion(1.0));
        root.count_iteration();
        let child = root.nested(&config).unwrap();
        assert_eq!(child.depth(), 1);
        assert_eq!(child.max_cost(), Some(1.5));
        assert_eq!(child.max_iterations(), 19);
        let grandchild = child.nested(&config).unwrap();
        assert_eq!(grandchild.max_cost(), Some(0.75));
        assert_eq!(grandchild.max_iterations(), 9);
        grandchild.charge(&completion(0.25));
        grandchild.count_iteration();
        assert_eq!(root.spent().cost, 1.25);
        assert_eq!(child.spent().cost, 0.25);
        assert_eq!(root.spent().tokens.input_tokens, 20);
        assert_eq!(root.spent().nested_iterations, 1);
        assert_eq!(child.spent().nested_iterations, 1);
        assert_eq!(root.remaining_iterations(), 38);
        let deeper = grandchild.nested(&config).unwrap_err();
        assert!(deeper.contains("maximum"), "{deeper}");
    }

    #[test]
    fn too_little_left_downgrades_and_a_spent_budget_refuses() {
        let config = RlmConfig::default();
        let root = BudgetController::root(&budget(0.6, 40, 2), &config);
        root.charge(&completion(0.2));
        assert!(root.nested(&config).unwrap_err().contains("under $0.50"));
        let few = BudgetController::root(&budget(10.0, 6, 2), &config);
        few.count_iteration();
        few.count_iteration();
        assert!(few
            .nested(&config)
            .unwrap_err()
            .contains("4 iteration(s) left"));
        assert!(root.admit().is_ok());
        root.charge(&completion(0.5));
        assert!(root.cost_exhausted());
        assert!(root.admit().unwrap_err().contains("spent"));
        let unlimited = BudgetController::root(&Budget::default(), &config);
        unlimited.charge(&completion(100.0));
        assert!(unlimited.admit().is_ok() && unlimited.nested(&config).is_ok());
    }
}
