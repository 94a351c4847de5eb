//! The SessionActor: one per session, owning exactly one Python worker at a time.
//!
//! Callers (the engine's `Session` handle, later the RPC server) send it [`Execute`],
//! [`SendInput`], [`Interrupt`], [`GetInfo`], [`Drain`], [`Close`] and the checkpoint
//! messages. It serialises executions in a bounded queue, relays the worker's output, input
//! requests and displays to the caller of the running execution, enforces the timeout (an
//! interrupt frame, then SIGKILL of the process group after the grace period) and treats the
//! worker's exit as an ordinary event:
//! the running execution ends `crashed` (or `timeout`) and the actor stops, so that actix
//! supervision restarts it under the same session id; the restarted actor keeps its queue
//! and takes a fresh worker from the pool. A closed session stays behind as a tombstone that
//! refuses work until the last handle to it is dropped.
//!
//! This file holds the actor, its states and its worker's arrival; each other job has a file:
//! `messages` (what callers send) and `handlers` (how each is taken in), `executions` (the
//! queue, timeouts, interrupts, finishing), `worker_events` (frames, output, the worker's exit),
//! `closing`, `forking` (clones of the worker for `session.fork`), `work_dir` (where the files API reads and writes), `state` and `durability` (checkpoints, restores, what a crash would lose), `idle`,
//! `completion`, `llm_calls`, and the proactive side: `proactive`, `serving`, `speculation`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use crate::execution::ExecutionStatus;
use crate::limits::SessionLimits;
use crate::memory::Memory;
use crate::metrics::{self, EngineCounters};
use crate::pool::{Acquire, PoolActor, Slot};
use crate::running::Running;
use crate::worker::{Worker, WorkerEvent, WorkerSpec};

mod closing;
mod completion;
mod deferred;
mod durability;
pub mod events;
mod executions;
mod forking;
mod handlers;
mod idle;
mod llm_calls;
mod messages;
mod proactive;
mod serving;
mod speculation;
mod state;
mod work_dir;
mod worker_events;

pub use completion::{Complete, Completion, MAX_COMPLETE_BYTES};
pub use durability::DurabilityReport;
pub use events::{Delivery, Executed, SessionEvent, Speculated, Subscribers, Subscription};
pub use forking::{ForkWorkers, ForkedWorkers, StartClone};
pub use llm_calls::LlmLink;
pub use messages::{
    CheckpointNow, CheckpointSummary, Close, CloseState, Drain, EventSender, Execute,
    ExecutionTicket, GetInfo, Interrupt, ListCheckpoints, Progress, RestoreCheckpoint,
    RestoreSummary, SendInput, SessionPhase, SessionSnapshot,
};
pub use proactive::ProactiveSetup;

use executions::host_error;
pub(crate) use executions::Queued;
pub(crate) use serving::ServePath;
pub use speculation::{Hint, PlannedSnippet, Speculate};
use state::Durability;
pub use state::{AutoCheckpoint, DurabilityMode, Inspection, StateSetup};
pub use work_dir::{GetWorkDir, WorkDir};

/// Most executions waiting behind the running one.
pub const MAX_QUEUED_EXECUTIONS: usize = 1024;

enum State {
    /// Between workers: the last one died and a replacement is on its way from the pool.
    Restarting,
    /// The worker is about to restore a checkpoint; executions wait until it has the frame.
    Restoring,
    Idle,
    Busy(Box<Running>),
    /// No worker could be had; the next execution asks the pool again.
    Failed,
    Closing,
    /// Closed for good: every request is refused.
    Closed,
}

impl State {
    fn phase(&self) -> SessionPhase {
        match self {
            State::Restarting | State::Restoring => SessionPhase::Restarting,
            State::Idle => SessionPhase::Idle,
            State::Busy(_) => SessionPhase::Busy,
            State::Failed => SessionPhase::Failed,
            State::Closing => SessionPhase::Closing,
            State::Closed => SessionPhase::Closed,
        }
    }
}

/// Event from the worker of a given generation; events of a previous worker are ignored.
struct Tagged(u64, WorkerEvent);

/// Everything a session needs besides its first worker.
pub struct SessionSetup {
    /// The worker kind to ask the pool for after a crash; the pool's own kind when `None`.
    pub spec: Option<Box<WorkerSpec>>,
    /// Largest frame the worker accepts, which bounds the code of one execution.
    pub max_frame: usize,
    pub limits: SessionLimits,
    pub pool: Addr<PoolActor>,
    pub counters: Arc<EngineCounters>,
    /// Who hears what the session does (executions, idleness, restores, its close).
    pub events: Subscribers,
    /// Proactive computation for this session; off when `None`.
    pub proactive: Option<ProactiveSetup>,
    /// Where the session keeps checkpoints; none are kept when `None`.
    pub state: Option<StateSetup>,
    /// Checkpoint and close the session after this long without activity; never when `None`.
    pub idle_timeout: Option<Duration>,
    /// The engine's memory and the owner the session remembers for; off when `None`.
    pub memory: Option<MemoryLink>,
    /// The LLM bridge of the session's code (`llm_query` and its kin); none when `None`.
    pub llm: Option<LlmLink>,
}

/// A session's tie to the engine's memory.
#[derive(Clone)]
pub struct MemoryLink {
    pub memory: Arc<Memory>,
    /// The session's owner (`""` for sessions without one).
    pub owner: Arc<str>,
}

/// The actor owning one session and its worker.
pub struct SessionActor {
    session_id: String,
    setup: SessionSetup,
    state: State,
    /// The worker leased at creation, taken over when the actor first starts.
    first_worker: Option<Worker>,
    worker: Option<Worker>,
    generation: u64,
    queue: VecDeque<Queued>,
    execution_count: u64,
    restarts: u64,
    /// Why the current worker is being killed, for the crash message.
    kill_reason: Option<String>,
    closers: Vec<oneshot::Sender<()>>,
    /// Set by [`Drain`]: new executions are refused; these wait for the running one to end.
    draining: Option<Vec<oneshot::Sender<()>>>,
    /// The phase last published to the `pyvisor_sessions` gauge.
    published_phase: Option<&'static str>,
    durability: Durability,
    completions: completion::Completions,
    /// Forks the worker has yet to answer.
    forks: forking::Forks,
    /// Keep the session's checkpoints when it closes (else they are deleted).
    keep_state: bool,
    proactive: Option<proactive::Proactive>,
    events: Subscribers,
    idleness: idle::Idleness,
    llm_calls: llm_calls::LlmCalls,
    /// Checkpoints and restores waiting for the worker.
    deferred: Vec<deferred::Deferred>,
}

impl SessionActor {
    /// A session that takes `worker` when the actor starts.
    pub fn new(session_id: String, worker: Worker, setup: SessionSetup) -> Self {
        let durability = Durability::new(setup.state.is_some());
        let proactive = setup.proactive.clone().map(proactive::Proactive::new);
        let events = setup.events.clone();
        let execution_count = (setup.state.as_ref())
            .filter(|state| state.restore_on_start)
            .map_or(0, |state| state.counted_from);
        Self {
            session_id,
            setup,
            state: State::Restarting,
            first_worker: Some(worker),
            worker: None,
            generation: 0,
            queue: VecDeque::new(),
            execution_count,
            restarts: 0,
            kill_reason: None,
            closers: Vec::new(),
            draining: None,
            published_phase: None,
            durability,
            completions: Default::default(),
            forks: Default::default(),
            keep_state: false,
            proactive,
            events,
            idleness: idle::Idleness::default(),
            llm_calls: Default::default(),
            deferred: Vec::new(),
        }
    }

    /// The count of the execution running now, or else of the last one to run.
    fn last_started_count(&self) -> u64 {
        let waiting = self.queue.len() as u64;
        self.execution_count.saturating_sub(waiting)
    }

    /// Makes `worker` the session's worker and starts what is queued.
    fn adopt(&mut self, mut worker: Worker, ctx: &mut Context<Self>) {
        self.generation += 1;
        let generation = self.generation;
        let events = std::mem::replace(&mut worker.events, mpsc::channel(1).1);
        ctx.add_stream(ReceiverStream::new(events).map(move |e| Tagged(generation, e)));
        self.worker = Some(worker);
        self.state = State::Idle;
        self.enable_llm();
        let restore_on_start = self
            .setup
            .state
            .as_mut()
            .is_some_and(|state| std::mem::take(&mut state.restore_on_start));
        if restore_on_start || std::mem::take(&mut self.durability.restore_next_worker) {
            return self.start_restore(None, None, true, ctx);
        }
        self.start_next(ctx);
    }

    /// Asks the pool for a replacement worker; requests keep queueing meanwhile.
    fn replace_worker(&mut self, ctx: &mut Context<Self>) {
        self.state = State::Restarting;
        // Spawned on this session's arbiter: the worker's pipes are served on the thread
        // that runs the session, as they were for the worker it replaces.
        let acquire = self.setup.pool.send(Acquire {
            spec: self.setup.spec.clone(),
            slot: Slot::Held,
            arbiter: Some(Arbiter::current()),
        });
        ctx.spawn(acquire.into_actor(self).map(|outcome, act, ctx| {
            let reason = match outcome {
                Ok(Ok(lease)) => match act.state {
                    State::Restarting => return act.adopt(lease.worker, ctx),
                    // Closed while waiting: the lease's worker ends as it is dropped.
                    _ => return,
                },
                Ok(Err(err)) => err.to_string(),
                Err(_) => "the pool has stopped".to_owned(),
            };
            tracing::warn!(session = %act.session_id, %reason, "no replacement worker");
            if let State::Restarting = act.state {
                act.fail_queue(&reason);
                act.fail_deferred(&reason);
                act.state = State::Failed;
            }
            act.publish_phase();
        }));
    }

    /// Brings the `pyvisor_sessions` gauge in line with the current state.
    fn publish_phase(&mut self) {
        let phase = self.state.phase().metric_label();
        metrics::session_phase_changed(self.published_phase, phase);
        self.published_phase = phase;
    }
}

impl Actor for SessionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        match (self.first_worker.take(), &self.state) {
            (_, State::Closed) => {}
            (Some(worker), _) => self.adopt(worker, ctx),
            (None, _) => self.replace_worker(ctx),
        }
        self.watch_idleness(ctx);
        self.publish_phase();
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        // Last line of defence: no worker outlives the actor that owns it.
        if let Some(worker) = self.worker.take() {
            worker.kill();
        }
        if !matches!(self.state, State::Restarting) {
            metrics::session_phase_changed(self.published_phase.take(), None);
        }
    }
}

impl Supervised for SessionActor {
    fn restarting(&mut self, _: &mut Context<Self>) {
        // The actor stops on purpose only after answering the running execution; anything
        // else that stopped it must not leave that caller waiting.
        if let State::Busy(running) = std::mem::replace(&mut self.state, State::Restarting) {
            running.into_result(
                ExecutionStatus::Crashed,
                None,
                Some(host_error("WorkerCrashed", "the session restarted")),
            );
        }
        self.kill_reason = None;
        self.durability.forget_timers();
    }
}
