//! Which predictions to compute, under a CPU grant: a dependency graph walked for the best
//! expected saving per CPU millisecond.
//!
//! Predictions form a DAG (`petgraph`): an edge A → B when B reads what A would produce (a
//! predicted `df = pd.read_csv(...)`, then `df.head()` on the state after it). Taking B means
//! taking its ancestors, whose cost counts against B. The walk repeatedly takes the node with
//! the highest `probability × saving / cost of what is not taken yet of its chain` that still
//! fits the grant, and returns what it took best first, each chain's untaken ancestors just
//! before it in topological order, so a child runs every parent before its dependants and
//! the likeliest answers first, should it be killed half way.

use petgraph::algo::toposort;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::Direction;

/// A prediction as the scheduler sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Chance that the session runs it next.
    pub probability: f64,
    /// Expected CPU (and wall) milliseconds of running it.
    pub cost_ms: f64,
    /// Index of the candidate it builds on, if any.
    pub after: Option<usize>,
}

/// Milliseconds charged for a snippet that costs less, so that free-looking snippets do not
/// crowd out the grant.
const MIN_COST_MS: f64 = 0.5;

/// The candidates to run, as indices into `candidates`, best first and parents before
/// dependants, whose
/// total cost fits `grant_ms`. A candidate on a cycle or naming a missing parent is left out.
pub fn plan(candidates: &[Candidate], grant_ms: f64) -> Vec<usize> {
    let mut graph = StableDiGraph::<usize, ()>::with_capacity(candidates.len(), candidates.len());
    let nodes: Vec<NodeIndex> = (0..candidates.len()).map(|i| graph.add_node(i)).collect();
    for (i, candidate) in candidates.iter().enumerate() {
        if let Some(parent) = candidate.after {
            match nodes.get(parent) {
                Some(&from) if parent != i => {
                    graph.add_edge(from, nodes[i], ());
                }
                _ => {
                    graph.remove_node(nodes[i]);
                }
            }
        }
    }
    let order = match toposort(&graph, None) {
        Ok(order) => order,
        Err(cycle) => {
            // Drop one node of the cycle at a time until none is left.
            let mut graph = graph;
            graph.remove_node(cycle.node_id());
            return plan_acyclic(&graph, candidates, grant_ms);
        }
    };
    take_best(&graph, &order, candidates, grant_ms)
}

fn plan_acyclic(
    graph: &StableDiGraph<usize, ()>,
    candidates: &[Candidate],
    grant_ms: f64,
) -> Vec<usize> {
    match toposort(graph, None) {
        Ok(order) => take_best(graph, &order, candidates, grant_ms),
        Err(cycle) => {
            let mut graph = graph.clone();
            graph.remove_node(cycle.node_id());
            plan_acyclic(&graph, candidates, grant_ms)
        }
    }
}

/// How many times a child's own cost a plan must have room for, unless it has room for every
/// candidate: each child pays its fork and the worker's pages again, so children planned on
/// the few milliseconds the bucket has just refilled would spend the budget on forks. Once is
/// enough: the likeliest guesses computed in every idle gap serve more than more guesses in
/// every other gap (13 held-out sequences on a VM where a child cost 45 to 80 ms: 33 and 28
/// cells served in two runs at 1, 29 at 0.5, 22 at 3).
const BATCH_OVERHEADS: f64 = 1.0;

/// What a bucket must be able to hold for a child of `overhead_ms` to be worth forking once
/// it is full: the child itself and [`BATCH_OVERHEADS`] times that for its snippets.
pub fn bucket_for_a_child(overhead_ms: f64) -> f64 {
    (1.0 + BATCH_OVERHEADS) * overhead_ms
}

/// Whether a child is worth forking now, with `room_ms` of a grant left after its own cost of
/// `overhead_ms`: room for all of `candidates`, or for [`BATCH_OVERHEADS`] times that cost.
pub fn worth_a_child(candidates: &[Candidate], room_ms: f64, overhead_ms: f64) -> bool {
    let all: f64 = candidates.iter().map(cost).sum();
    room_ms >= all.min(BATCH_OVERHEADS * overhead_ms)
}

/// The least chance of serving the next cell that a child must buy with each CPU millisecond
/// it is expected to cost, its own overhead included. A plan below it spends the budget on
/// guesses so unlikely that the bucket is better kept for the likely ones that follow the
/// next real run, and costs a request that comes while its child runs page faults for
/// nothing; a session that keeps running cells the predictor does not foresee (`x = 1` again
/// and again) soon has only such plans left, and then no child at all. In replays of 13
/// held-out sequences, the children planned below it used a quarter of the CPU spent and
/// served no cell.
pub const MIN_PLAN_DENSITY: f64 = 2e-4;

/// The longest start of `plan` (best first, parents before dependants) worth a child of
/// `overhead_ms`: whose summed probability per expected CPU millisecond is at least
/// [`MIN_PLAN_DENSITY`]; empty when none is.
pub fn worthwhile<'p>(
    candidates: &[Candidate],
    plan: &'p [usize],
    overhead_ms: f64,
) -> &'p [usize] {
    let (mut probability, mut cost_ms) = (0.0, overhead_ms);
    let mut longest = 0;
    for (taken, &i) in plan.iter().enumerate() {
        probability += candidates[i].probability;
        cost_ms += cost(&candidates[i]);
        if probability >= MIN_PLAN_DENSITY * cost_ms {
            longest = taken + 1;
        }
    }
    &plan[..longest]
}

/// Whether to wait for the bucket to hold `largest_ms` rather than fork for `now`: a
/// candidate that only such a grant pays for is likelier than all of `now` together. Without
/// it a hinted snippet that needs a full bucket (after it ran out of CPU in a smaller one) is
/// never computed while cheap unlikely guesses spend the budget as it refills.
pub fn worth_waiting(candidates: &[Candidate], now: &[usize], largest_ms: f64) -> bool {
    let now_probability: f64 = now.iter().map(|&i| candidates[i].probability).sum();
    plan(candidates, largest_ms)
        .iter()
        .any(|i| !now.contains(i) && candidates[*i].probability > now_probability)
}

fn cost(candidate: &Candidate) -> f64 {
    candidate.cost_ms.max(MIN_COST_MS)
}

/// The greedy walk over an acyclic `graph` whose topological order is `order`.
fn take_best(
    graph: &StableDiGraph<usize, ()>,
    order: &[NodeIndex],
    candidates: &[Candidate],
    grant_ms: f64,
) -> Vec<usize> {
    let mut taken = vec![false; candidates.len()];
    let mut planned = Vec::new();
    let mut left = grant_ms;
    loop {
        let mut best: Option<(f64, Vec<NodeIndex>, f64)> = None;
        for &node in order {
            let index = graph[node];
            if taken[index] {
                continue;
            }
            let chain = untaken_chain(graph, node, &taken);
            let chain_cost: f64 = chain.iter().map(|&n| cost(&candidates[graph[n]])).sum();
            if chain_cost > left {
                continue;
            }
            let candidate = &candidates[index];
            let score = candidate.probability * cost(candidate) / chain_cost;
            if best.as_ref().is_none_or(|(top, _, _)| score > *top) {
                best = Some((score, chain, chain_cost));
            }
        }
        let Some((_, chain, chain_cost)) = best else {
            break;
        };
        for &node in order.iter().filter(|node| chain.contains(node)) {
            taken[graph[node]] = true;
            planned.push(graph[node]);
        }
        left -= chain_cost;
    }
    planned
}

/// `node` and its ancestors that are not taken yet.
fn untaken_chain(
    graph: &StableDiGraph<usize, ()>,
    node: NodeIndex,
    taken: &[bool],
) -> Vec<NodeIndex> {
    let mut chain = vec![node];
    let mut pending = vec![node];
    while let Some(current) = pending.pop() {
        for parent in graph.neighbors_directed(current, Direction::Incoming) {
            if !taken[graph[parent]] && !chain.contains(&parent) {
                chain.push(parent);
                pending.push(parent);
            }
        }
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(probability: f64, cost_ms: f64) -> Candidate {
        Candidate {
            probability,
            cost_ms,
            after: None,
        }
    }

    fn total_cost(candidates: &[Candidate], plan: &[usize]) -> f64 {
        plan.iter().map(|&i| cost(&candidates[i])).sum()
    }

    #[test]
    fn the_plan_fits_the_grant() {
        let candidates: Vec<Candidate> = (0..50)
            .map(|i| leaf(1.0 / (i + 1) as f64, 3.0 + (i % 7) as f64))
            .collect();
        for grant in [0.0, 1.0, 10.0, 25.0, 100.0, 1000.0] {
            let plan = plan(&candidates, grant);
            assert!(
                total_cost(&candidates, &plan) <= grant,
                "grant {grant}: {plan:?}"
            );
        }
        assert_eq!(plan(&candidates, 1e9).len(), 50);
    }

    #[test]
    fn the_best_saving_per_millisecond_goes_first() {
        // Same saving (probability × cost) for 0 and 1; 2 saves most per millisecond.
        let candidates = [leaf(0.1, 100.0), leaf(0.5, 20.0), leaf(0.9, 2.0)];
        assert_eq!(plan(&candidates, 3.0), vec![2]);
        assert_eq!(plan(&candidates, 22.0), vec![2, 1]);
    }

    #[test]
    fn a_dependant_brings_its_parent_and_comes_after_it() {
        let candidates = [
            leaf(0.9, 1.0),
            Candidate {
                probability: 0.05,
                cost_ms: 40.0,
                after: None,
            },
            Candidate {
                probability: 0.8,
                cost_ms: 2.0,
                after: Some(1),
            },
        ];
        let plan = plan(&candidates, 50.0);
        let parent = plan
            .iter()
            .position(|&i| i == 1)
            .expect("the parent is taken");
        let child = plan
            .iter()
            .position(|&i| i == 2)
            .expect("the child is taken");
        assert!(parent < child, "{plan:?}");
        // Without room for the parent, the child is not taken either.
        assert_eq!(self::plan(&candidates, 10.0), vec![0]);
    }

    #[test]
    fn cycles_and_missing_parents_are_left_out() {
        let candidates = [
            Candidate {
                probability: 0.5,
                cost_ms: 1.0,
                after: Some(1),
            },
            Candidate {
                probability: 0.5,
                cost_ms: 1.0,
                after: Some(0),
            },
            Candidate {
                probability: 0.5,
                cost_ms: 1.0,
                after: Some(9),
            },
            leaf(0.5, 1.0),
        ];
        let plan = plan(&candidates, 100.0);
        assert!(plan.contains(&3));
        assert!(!plan.contains(&2));
        assert!(!(plan.contains(&0) && plan.contains(&1)), "{plan:?}");
    }

    #[test]
    fn a_child_waits_for_room_worth_its_own_cost() {
        let candidate = |cost_ms| Candidate {
            probability: 0.5,
            cost_ms,
            after: None,
        };
        let cheap = [candidate(1.0), candidate(2.0)];
        assert!(worth_a_child(&cheap, 3.0, 20.0), "room for all of them");
        assert!(!worth_a_child(&cheap, 2.5, 20.0));
        let costly = [candidate(50.0), candidate(40.0)];
        assert!(
            !worth_a_child(&costly, 15.0, 20.0),
            "a few ms of work for a 20 ms fork"
        );
        assert!(worth_a_child(&costly, 25.0, 20.0));
    }

    #[test]
    fn a_child_must_buy_enough_chance_with_the_cpu_it_costs() {
        let candidates = [leaf(0.004, 5.0), leaf(0.0005, 10.0), leaf(0.004, 1.0)];
        // 0.004 over 10 + 5 ms: 2.7e-4 per ms; with a child of 30 ms, 1.1e-4.
        assert_eq!(worthwhile(&candidates, &[0], 10.0), [0]);
        assert!(worthwhile(&candidates, &[0], 30.0).is_empty());
        // What an unlikely guess adds costs more than the chance it brings, unless what
        // comes after it makes up for it.
        assert_eq!(worthwhile(&candidates, &[0, 1], 10.0), [0]);
        assert_eq!(worthwhile(&candidates, &[0, 1, 2], 10.0), [0, 1, 2]);
        assert!(worthwhile(&candidates, &[], 0.0).is_empty());
    }

    #[test]
    fn a_likely_snippet_that_needs_a_fuller_bucket_is_waited_for() {
        let candidates = [leaf(0.9, 150.0), leaf(0.01, 5.0), leaf(0.01, 5.0)];
        let now = plan(&candidates, 20.0);
        assert_eq!(now.len(), 2);
        assert!(worth_waiting(&candidates, &now, 180.0));
        // Not for one that even a full bucket cannot pay for, nor for a less likely one.
        assert!(!worth_waiting(&candidates, &now, 100.0));
        let candidates = [leaf(0.05, 150.0), leaf(0.3, 5.0)];
        assert!(!worth_waiting(&candidates, &plan(&candidates, 20.0), 180.0));
    }

    #[test]
    fn a_full_bucket_is_always_worth_a_child() {
        let costly: Vec<Candidate> = (0..40)
            .map(|_| Candidate {
                probability: 0.1,
                cost_ms: 5.0,
                after: None,
            })
            .collect();
        for overhead in [5.0, 20.0, 65.0, 400.0] {
            let room = bucket_for_a_child(overhead) - overhead;
            assert!(worth_a_child(&costly, room, overhead), "{overhead} ms");
        }
    }
}
