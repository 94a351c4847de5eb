//! The PredictorActor: what each idle session will likely run next, and which of those
//! predictions to compute, under the engine's CPU budget.
//!
//! It subscribes to every proactive session's events. An execution's code and facts feed the
//! session's [`SessionModel`], and settle the predictions made before it (right or wrong),
//! which is how [`Learned`] tunes probabilities and runtimes from outcomes. When a session is
//! idle, the actor asks the model for ranked predictions, leaves out what was already computed
//! for this state, plans the rest as a dependency graph under a CPU grant from the
//! [`CpuBudget`], less what a child costs beyond its snippets ([`ChildOverhead`], learned),
//! ([`schedule::plan`]) and sends the plan to the session as one [`Speculate`].
//! A session counts as idle once it has been quiet for [`QUIET`]: a caller that sends its
//! next request at once (a loop, a script) never waits behind a fork of its worker. A tick
//! retries idle sessions as the budget refills. Nothing is started while the machine
//! has more runnable threads than CPUs (foreground work waiting for a CPU), unless told not to
//! yield. Explicit hints (`session.hint`, [`SessionEvent::Hinted`]) go first.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::budget::{ChildOverhead, CpuBudget};
use super::predict::{
    mentions_any, normalise, Learned, Prediction, SessionModel, Source, Table, MIN_COST_MS,
};
use super::schedule::{self, Candidate};
use super::stats::ProactiveCounters;
use crate::execution::ExecutionStatus;
use crate::session::{PlannedSnippet, SessionActor, SessionEvent, Speculate};
use pyvisor_protocol::CellFacts;

/// Predictions asked of a session's model each time it is idle.
const PREDICTIONS: usize = 60;
/// Most CPU milliseconds one speculation may be granted, unless its child alone needs more.
const MAX_GRANT_MS: f64 = 1000.0;
/// How often idle sessions are tried again as the budget refills.
const TICK: Duration = Duration::from_millis(200);
/// How long a session must have had nothing to run before it is speculated on.
pub const QUIET: Duration = Duration::from_millis(30);

/// How the predictor spends the engine's CPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictorConfig {
    /// Share of one core that speculation may use over time (0.1: 10%).
    pub cpu_budget: f64,
    /// Start nothing while the machine has more runnable threads than CPUs.
    pub yield_to_load: bool,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        Self {
            cpu_budget: 0.1,
            yield_to_load: true,
        }
    }
}

/// What the predictor knows of one session.
struct Followed {
    model: SessionModel,
    addr: Option<Addr<SessionActor>>,
    /// Since when the session has had nothing to run; `None` while it runs something.
    idle_since: Option<Instant>,
    speculating: bool,
    /// Normal forms computed for the current state, not to be computed again.
    tried: HashSet<String>,
    /// Snippets that gave no answer to keep (an error, an answer the worker's checks
    /// refused): the same again until a real run changes a name they mention, so not
    /// computed again until then.
    failed: HashSet<String>,
    /// Predictions scheduled since the last execution: normal form → (source, template).
    pending: HashMap<String, (Source, String)>,
    /// Snippets that ran out of CPU in a child, in this state: normal form → the CPU
    /// milliseconds they are now believed to need (twice what they had, each time, up to
    /// all a child can have; infinite once they had that).
    cut_off: HashMap<String, f64>,
    /// CPU milliseconds the snippets of the speculation in flight have reported.
    snippets_cpu_ms: f64,
    /// The ambient token of the last real run's facts: display options, working directory.
    ambient: String,
    /// The model's predictions for the current state and history, made once per idle spell
    /// rather than at every tick (a few milliseconds each, for every idle session).
    predictions: Option<Vec<Prediction>>,
}

impl Followed {
    fn new() -> Self {
        Self {
            model: SessionModel::new(),
            addr: None,
            idle_since: None,
            speculating: false,
            tried: HashSet::new(),
            failed: HashSet::new(),
            pending: HashMap::new(),
            cut_off: HashMap::new(),
            snippets_cpu_ms: 0.0,
            ambient: String::new(),
            predictions: None,
        }
    }
}

/// The actor predicting and scheduling speculation for every proactive session.
pub struct PredictorActor {
    config: PredictorConfig,
    table: &'static Table,
    learned: Learned,
    budget: CpuBudget,
    overhead: ChildOverhead,
    counters: Arc<ProactiveCounters>,
    sessions: HashMap<Arc<str>, Followed>,
    cpus: usize,
}

impl PredictorActor {
    pub fn new(
        config: PredictorConfig,
        table: &'static Table,
        counters: Arc<ProactiveCounters>,
    ) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            config,
            table,
            learned: Learned::default(),
            budget: CpuBudget::new(config.cpu_budget, Instant::now()),
            overhead: ChildOverhead::default(),
            counters,
            sessions: HashMap::new(),
            cpus,
        }
    }

    /// Whether foreground work waits for a CPU now: more runnable threads than CPUs.
    fn machine_busy(&self) -> bool {
        if !self.config.yield_to_load {
            return false;
        }
        // The fourth field of /proc/loadavg is "runnable/total" scheduling entities, this
        // thread included.
        let runnable = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|text| {
                let field = text.split_whitespace().nth(3)?;
                field.split('/').next()?.parse::<usize>().ok()
            });
        runnable.is_some_and(|runnable| runnable.saturating_sub(1) > self.cpus)
    }

    /// The most CPU milliseconds the snippets of one child can have: a full bucket, less the
    /// child's own cost.
    fn largest_room(&self) -> f64 {
        self.budget.capacity_ms().min(MAX_GRANT_MS) - self.overhead.ms()
    }

    /// The session took the `planned` snippets (`sent` is `None` when it did not) and sent
    /// `sent` of them to its worker. What it took is tried in this state (an answer that
    /// still holds is not computed again, nor one the cache has no room for) and its outcome
    /// awaited; what it did not take may be planned again.
    fn sent(
        &mut self,
        session_id: &Arc<str>,
        planned: Vec<(String, (Source, String))>,
        sent: Option<Vec<String>>,
    ) {
        let Some(followed) = self.sessions.get_mut(session_id) else {
            return;
        };
        let Some(sent) = sent else {
            followed.speculating = false;
            return;
        };
        // Still speculating unless nothing was sent, or its end came first (then it must not
        // be marked as running again: nothing would ever clear it).
        if sent.is_empty() {
            followed.speculating = false;
        }
        for (normal, (source, template)) in planned {
            if sent.contains(&normal) {
                self.counters.predicted(source.as_str());
            }
            followed.tried.insert(normal.clone());
            followed.pending.insert(normal, (source, template));
        }
    }

    fn executed(&mut self, event: &crate::session::Executed) {
        let Some(followed) = self.sessions.get_mut(&event.session_id) else {
            return;
        };
        let normal = normalise(&event.code);
        followed.predictions = None;
        for (predicted, (source, template)) in followed.pending.drain() {
            let right = normal.as_deref() == Some(predicted.as_str());
            self.learned.record(source, &template, right);
        }
        if event.served_by.is_none() {
            // Ran for real: the state may have changed, and what was computed for the old
            // one may be computed again (answers that still hold come back with the next
            // idle), unless it failed and reads nothing the run changed.
            followed.tried.clear();
            match changed_names(event.facts.as_deref(), &followed.ambient) {
                Some(changed) => {
                    followed.failed.retain(|n| !mentions_any(n, &changed));
                    followed.cut_off.retain(|n, _| !mentions_any(n, &changed));
                }
                None => {
                    followed.failed.clear();
                    followed.cut_off.clear();
                }
            }
            if let Some(facts) = &event.facts {
                followed.ambient.clone_from(&facts.ambient);
            }
        }
        if let Some(facts) = &event.facts {
            let ok = event.status == ExecutionStatus::Ok;
            followed.model.observe(&event.code, facts, ok);
        }
        followed.idle_since = None;
    }

    /// Plans and sends a speculation to `session_id` if it is idle and the budget allows.
    fn schedule(&mut self, session_id: &Arc<str>, ctx: &mut Context<Self>) {
        let quiet = |f: &Followed| f.idle_since.is_some_and(|since| since.elapsed() >= QUIET);
        let ready = self
            .sessions
            .get(session_id)
            .is_some_and(|f| quiet(f) && !f.speculating && f.addr.is_some());
        if !ready || self.machine_busy() {
            return;
        }
        let largest = self.largest_room();
        let followed = self.sessions.get_mut(session_id).expect("checked above");
        let (table, learned) = (self.table, &self.learned);
        let predictions = followed
            .predictions
            .get_or_insert_with(|| followed.model.predict(table, learned, PREDICTIONS))
            .clone();
        let ranked = predictions.iter().map(|p| p.normal.clone()).collect();
        let mut predictions = untried(predictions, |normal| {
            followed.tried.contains(normal) || followed.failed.contains(normal)
        });
        for p in &mut predictions {
            if let Some(&needs) = followed.cut_off.get(&p.normal) {
                p.cost_ms = p.cost_ms.max(needs);
            }
        }
        if predictions.is_empty() {
            return;
        }
        // All the bucket holds: costs are estimates, and a child that needs less uses less.
        let overhead = self.overhead.ms();
        let full = schedule::bucket_for_a_child(overhead);
        self.budget.hold_at_least(full);
        let Some(grant) = self.budget.grant(Instant::now(), MAX_GRANT_MS.max(full)) else {
            return;
        };
        let candidates: Vec<Candidate> = predictions
            .iter()
            .map(|p| Candidate {
                probability: p.probability,
                cost_ms: p.cost_ms,
                after: p.after,
            })
            .collect();
        // The child's own cost comes first out of the grant.
        let room = grant - overhead;
        if !schedule::worth_a_child(&candidates, room, overhead) {
            tracing::debug!(
                session = %session_id,
                grant_ms = grant,
                child_overhead_ms = overhead,
                "speculation deferred until the budget has room for a child"
            );
            return; // the tick tries again as the bucket fills
        }
        let plan = schedule::plan(&candidates, room);
        let plan = schedule::worthwhile(&candidates, &plan, overhead);
        if plan.is_empty() {
            return; // nothing left worth a fork until the session runs something
        }
        if schedule::worth_waiting(&candidates, plan, largest) {
            return; // the tick tries again as the bucket fills
        }
        tracing::debug!(
            session = %session_id,
            probability = plan.iter().map(|&i| predictions[i].probability).sum::<f64>(),
            planned = ?plan
                .iter()
                .map(|&i| (predictions[i].normal.as_str(), predictions[i].probability))
                .collect::<Vec<_>>(),
            "speculation planned"
        );
        let snippets: Vec<PlannedSnippet> = plan
            .iter()
            .map(|&i| PlannedSnippet {
                code: predictions[i].code.clone(),
                normal: predictions[i].normal.clone(),
                source: predictions[i].source.as_str(),
            })
            .collect();
        let planned: Vec<(String, (Source, String))> = plan
            .iter()
            .map(|&i| {
                let p = &predictions[i];
                (p.normal.clone(), (p.source, p.template.clone()))
            })
            .collect();
        followed.speculating = true;
        followed.snippets_cpu_ms = 0.0;
        let addr = followed.addr.clone().expect("checked above");
        let request = Speculate {
            snippets,
            cpu_ms: grant.ceil() as u64,
            ranked,
        };
        let session_id = session_id.clone();
        ctx.spawn(
            addr.send(request)
                .into_actor(self)
                .map(move |sent, act, _| act.sent(&session_id, planned, sent.ok().flatten())),
        );
    }
}

/// The names a real run bound or may have changed, from its facts; `None` when anything may
/// have changed: no facts, names it cannot tell, or other display options or directory than
/// the run before (`ambient`).
fn changed_names(facts: Option<&CellFacts>, ambient: &str) -> Option<HashSet<String>> {
    let facts = facts.filter(|f| f.ambient == ambient)?;
    let touched = facts.touched.as_ref()?;
    Some(touched.iter().chain(&facts.binds).cloned().collect())
}

/// `predictions` without those computed already for this state, except the parents that an
/// untried prediction builds on; `after` indices are renumbered.
fn untried(predictions: Vec<Prediction>, tried: impl Fn(&str) -> bool) -> Vec<Prediction> {
    let mut keep: Vec<bool> = predictions.iter().map(|p| !tried(&p.normal)).collect();
    for i in 0..predictions.len() {
        let mut parent = if keep[i] { predictions[i].after } else { None };
        while let Some(p) = parent.filter(|&p| p < predictions.len()) {
            keep[p] = true;
            parent = predictions[p].after;
        }
    }
    let mut renumbered = vec![None; predictions.len()];
    let mut kept = Vec::new();
    for (i, prediction) in predictions.into_iter().enumerate() {
        if keep[i] {
            renumbered[i] = Some(kept.len());
            kept.push(prediction);
        }
    }
    for prediction in &mut kept {
        prediction.after = prediction
            .after
            .and_then(|p| renumbered.get(p).copied().flatten());
    }
    kept
}

impl Actor for PredictorActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_interval(TICK, |act, ctx| {
            let idle: Vec<Arc<str>> = act
                .sessions
                .iter()
                .filter(|(_, f)| f.idle_since.is_some() && !f.speculating)
                .map(|(id, _)| id.clone())
                .collect();
            for session_id in idle {
                act.schedule(&session_id, ctx);
            }
        });
    }
}

impl Handler<SessionEvent> for PredictorActor {
    type Result = ();

    fn handle(&mut self, event: SessionEvent, ctx: &mut Context<Self>) {
        match event {
            SessionEvent::Executed(executed) => {
                self.sessions
                    .entry(executed.session_id.clone())
                    .or_insert_with(Followed::new);
                self.executed(&executed);
            }
            SessionEvent::Idle {
                session_id,
                addr,
                since,
                computed,
            } => {
                let followed = self
                    .sessions
                    .entry(session_id.clone())
                    .or_insert_with(Followed::new);
                followed.idle_since.get_or_insert(since);
                followed.addr = Some(addr);
                // Answers that outlived the last real execution are not planned again: the
                // session would drop them, and the grant would go to a child with less to do.
                followed.tried.extend(computed);
                // Sessions hold their events for the predictor until they have been quiet,
                // so the wait is usually over when this comes.
                let wait = QUIET.saturating_sub(since.elapsed());
                if wait.is_zero() {
                    self.schedule(&session_id, ctx);
                } else {
                    ctx.run_later(wait, move |act, ctx| act.schedule(&session_id, ctx));
                }
            }
            SessionEvent::Speculated(speculated) => {
                let Some(followed) = self.sessions.get_mut(&speculated.session_id) else {
                    return;
                };
                followed.snippets_cpu_ms += speculated.cpu_ms;
                let normal = normalise(&speculated.code);
                if let (Some(normal), false) = (&normal, speculated.servable) {
                    followed.failed.insert(normal.clone());
                }
                let template = normal
                    .and_then(|normal| followed.pending.get(&normal))
                    .map(|(_, template)| template.clone());
                if let Some(template) = template {
                    self.learned
                        .record_runtime(&template, speculated.duration_ms);
                }
            }
            SessionEvent::SpeculationEnded {
                session_id,
                cpu_ms,
                finished,
                unrun,
                cut_off,
            } => {
                self.budget.spend(Instant::now(), cpu_ms);
                if let (Some(followed), true) = (self.sessions.get(&session_id), finished) {
                    self.overhead.observe(cpu_ms, followed.snippets_cpu_ms);
                }
                let (overhead, largest) = (self.overhead.ms(), self.largest_room());
                if let Some(followed) = self.sessions.get_mut(&session_id) {
                    followed.speculating = false;
                    for normal in &unrun {
                        followed.tried.remove(normal);
                        followed.pending.remove(normal);
                    }
                    if let Some(normal) = cut_off {
                        // Planned again with twice the CPU it had, or all a child can have;
                        // a snippet that had that much is left alone.
                        let had = cpu_ms - followed.snippets_cpu_ms - overhead;
                        let needs = followed.cut_off.entry(normal.clone()).or_default();
                        if *needs >= largest {
                            *needs = f64::INFINITY;
                            followed.tried.insert(normal);
                        } else {
                            *needs = needs.max(2.0 * had.max(MIN_COST_MS)).min(largest);
                            followed.tried.remove(&normal);
                        }
                    }
                }
            }
            SessionEvent::Hinted { session_id, code } => {
                // A session that has run nothing yet is first heard of by its hint.
                let followed = self
                    .sessions
                    .entry(session_id.clone())
                    .or_insert_with(Followed::new);
                followed.model.hint(code);
                followed.predictions = None;
                followed.tried.clear();
                self.schedule(&session_id, ctx);
            }
            SessionEvent::Restored { session_id } => {
                if let Some(followed) = self.sessions.get_mut(&session_id) {
                    followed.model.forget();
                    followed.predictions = None;
                    followed.tried.clear();
                    followed.failed.clear();
                    followed.pending.clear();
                    followed.cut_off.clear();
                }
            }
            SessionEvent::Closed { session_id } => {
                self.sessions.remove(&session_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use actix::dev::channel;

    use super::*;
    use crate::session::Executed;

    fn predictor() -> PredictorActor {
        let config = PredictorConfig {
            cpu_budget: 0.1,
            yield_to_load: false,
        };
        PredictorActor::new(config, Table::builtin(), Default::default())
    }

    fn idle(session_id: &Arc<str>, computed: &[&str]) -> SessionEvent {
        let (sender, _) = channel::channel::<SessionActor>(16);
        SessionEvent::Idle {
            session_id: session_id.clone(),
            addr: Addr::new(sender),
            since: Instant::now(),
            computed: computed.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn ran_for_real(session_id: &Arc<str>, code: &str) -> SessionEvent {
        executed(session_id, code, None)
    }

    fn executed(session_id: &Arc<str>, code: &str, facts: Option<CellFacts>) -> SessionEvent {
        SessionEvent::Executed(Arc::new(Executed {
            session_id: session_id.clone(),
            execution_id: "e-1".into(),
            code: code.into(),
            status: ExecutionStatus::Ok,
            facts: facts.map(Box::new),
            duration_ms: 1.0,
            served_by: None,
        }))
    }

    fn tried(predictor: &PredictorActor, session_id: &Arc<str>) -> Vec<String> {
        sorted(&predictor.sessions[session_id].tried)
    }

    fn failed(predictor: &PredictorActor, session_id: &Arc<str>) -> Vec<String> {
        sorted(&predictor.sessions[session_id].failed)
    }

    fn sorted(names: &HashSet<String>) -> Vec<String> {
        let mut names: Vec<String> = names.iter().cloned().collect();
        names.sort();
        names
    }

    fn ended(session_id: &Arc<str>, cpu_ms: f64, unrun: &[&str], cut_off: &str) -> SessionEvent {
        SessionEvent::SpeculationEnded {
            session_id: session_id.clone(),
            cpu_ms,
            finished: false,
            unrun: unrun.iter().map(|c| c.to_string()).collect(),
            cut_off: Some(cut_off.into()),
        }
    }

    #[actix::test]
    async fn a_child_out_of_cpu_leaves_what_it_did_not_run_to_be_planned_again() {
        let mut predictor = predictor();
        let mut ctx = Context::new();
        let session: Arc<str> = "s-1".into();
        predictor.handle(idle(&session, &["a", "slow", "b"]), &mut ctx);
        let overhead = predictor.overhead.ms();
        predictor.handle(ended(&session, overhead + 30.0, &["b"], "slow"), &mut ctx);
        assert_eq!(tried(&predictor, &session), ["a"]);
        // The snippet it died in is planned again only with twice the CPU it had, or all a
        // child can have (the bucket holds 200 ms at 10% of a core); then it is left alone.
        let needs = |predictor: &PredictorActor| predictor.sessions[&session].cut_off["slow"];
        assert_eq!(needs(&predictor), 60.0);
        predictor.handle(ended(&session, overhead + 20.0, &[], "slow"), &mut ctx);
        assert_eq!(needs(&predictor), 60.0);
        predictor.handle(ended(&session, overhead + 120.0, &[], "slow"), &mut ctx);
        assert_eq!(needs(&predictor), 200.0 - overhead);
        assert_eq!(tried(&predictor, &session), ["a"]);
        predictor.handle(ended(&session, 200.0, &[], "slow"), &mut ctx);
        assert_eq!(needs(&predictor), f64::INFINITY);
        assert_eq!(tried(&predictor, &session), ["a", "slow"]);
        // A real run starts a new state, whose costs are learned again.
        predictor.handle(ran_for_real(&session, "x = 1"), &mut ctx);
        assert!(predictor.sessions[&session].cut_off.is_empty());
    }

    fn ran_with_facts(
        session_id: &Arc<str>,
        binds: &[&str],
        touched: Option<&[&str]>,
        ambient: &str,
    ) -> SessionEvent {
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        let facts = CellFacts {
            binds: names(binds),
            touched: touched.map(names),
            ambient: ambient.into(),
            ..CellFacts::default()
        };
        executed(session_id, "x = 1", Some(facts))
    }

    fn speculated(session_id: &Arc<str>, code: &str, servable: bool) -> SessionEvent {
        SessionEvent::Speculated(Arc::new(crate::session::Speculated {
            session_id: session_id.clone(),
            code: code.into(),
            source: "template",
            servable,
            duration_ms: 1.0,
            cpu_ms: 1.0,
        }))
    }

    #[actix::test]
    async fn what_failed_is_not_computed_again_until_a_real_run_changes_what_it_mentions() {
        let mut predictor = predictor();
        let mut ctx = Context::new();
        let session: Arc<str> = "s-1".into();
        predictor.handle(ran_with_facts(&session, &[], Some(&[]), "a"), &mut ctx);
        for (code, servable) in [("df.std()", false), ("x + 1", false), ("df.shape", true)] {
            predictor.handle(speculated(&session, code, servable), &mut ctx);
        }
        assert_eq!(failed(&predictor, &session), ["df.std()", "x+1"]);
        predictor.handle(ran_with_facts(&session, &["x"], Some(&[]), "a"), &mut ctx);
        assert_eq!(failed(&predictor, &session), ["df.std()"]);
        // Other display options, or names the worker cannot tell: anything may differ.
        predictor.handle(ran_with_facts(&session, &[], Some(&[]), "b"), &mut ctx);
        assert!(failed(&predictor, &session).is_empty());
        predictor.handle(speculated(&session, "df.std()", false), &mut ctx);
        predictor.handle(ran_with_facts(&session, &["y"], None, "b"), &mut ctx);
        assert!(failed(&predictor, &session).is_empty());
    }

    #[actix::test]
    async fn no_child_is_forked_for_a_plan_too_unlikely_to_serve_anything() {
        let mut predictor = predictor();
        let mut ctx = Context::new();
        let session: Arc<str> = "s-1".into();
        predictor.handle(ran_for_real(&session, "x = 1"), &mut ctx);
        predictor.handle(idle(&session, &[]), &mut ctx);
        let guess = |code: &str, probability: f64| Prediction {
            code: code.into(),
            normal: code.into(),
            source: Source::Template,
            template: "$0".into(),
            probability,
            cost_ms: 1.0,
            after: None,
        };
        let mut plan_for = |predictions: Vec<Prediction>| {
            let followed = predictor.sessions.get_mut(&session).expect("followed");
            followed.idle_since = Some(Instant::now() - Duration::from_secs(1));
            followed.speculating = false;
            followed.predictions = Some(predictions);
            predictor.schedule(&session, &mut ctx);
            predictor.sessions[&session].speculating
        };
        let unlikely = schedule::MIN_PLAN_DENSITY;
        assert!(!plan_for(vec![guess("x", unlikely), guess("y", unlikely)]));
        assert!(plan_for(vec![guess("x", unlikely), guess("x + 1", 0.1)]));
    }

    #[actix::test]
    async fn a_hint_is_used_up_by_a_run_after_it_not_by_one_before() {
        let mut predictor = predictor();
        let mut ctx = Context::new();
        let session: Arc<str> = "s-1".into();
        let code = "sum(xs) * 3";
        let hinted = |code: &str| SessionEvent::Hinted {
            session_id: session.clone(),
            code: vec![code.into()],
        };
        let first = |predictor: &PredictorActor| {
            let followed = &predictor.sessions[&session];
            let predictions = followed
                .model
                .predict(predictor.table, &predictor.learned, 1);
            predictions.first().map(|p| (p.source, p.normal.clone()))
        };
        // The session tells its events in order: a run of the hinted code before the hint...
        let ran = || executed(&session, code, Some(CellFacts::default()));
        predictor.handle(ran(), &mut ctx);
        predictor.handle(hinted(code), &mut ctx);
        assert_eq!(first(&predictor), Some((Source::Hint, "sum(xs)*3".into())));
        // ...leaves it, a run after it uses it up.
        predictor.handle(ran(), &mut ctx);
        assert_ne!(
            first(&predictor).map(|(source, _)| source),
            Some(Source::Hint)
        );
    }

    #[actix::test]
    async fn answers_that_outlive_a_real_run_are_not_planned_again() {
        let mut predictor = predictor();
        let mut ctx = Context::new();
        let session: Arc<str> = "s-1".into();
        predictor.handle(idle(&session, &["df.head()"]), &mut ctx);
        assert_eq!(tried(&predictor, &session), ["df.head()"]);
        // A real run may have changed what they read: the session says which still hold.
        predictor.handle(ran_for_real(&session, "x = 1"), &mut ctx);
        assert!(tried(&predictor, &session).is_empty());
        predictor.handle(idle(&session, &["df.head()", "df.shape"]), &mut ctx);
        assert_eq!(tried(&predictor, &session), ["df.head()", "df.shape"]);
    }
}
