//! [`Dispatcher`]: the engine's [`LlmBridge`], which answers the `llm_query` and
//! `llm_query_batched` calls of sessions' code with an [`LlmClient`].
//!
//! Calls run on a thread of their own with a small runtime, so no session's arbiter waits on
//! the network. Calls that arrive within `[llm] batch_window_ms` of the first of a window go
//! out together when it closes. Requests in flight are bounded twice: by `max_concurrency`
//! for the engine and by `session_concurrency` for one session, which takes its session's
//! permit before the engine's, so one session flooding the bridge holds at most its share
//! and the others' calls still go out. A session may have at most `max_pending` prompts
//! waiting or in flight; more are refused with `LlmError`. Dropping a call's future (the
//! execution ended) drops its requests. [`Dispatcher::ask`] gives each prompt's completion,
//! for the task loops' bridges, which account their cost; `rlm_query` is theirs alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::{join_all, BoxFuture};
use pyvisor_actors::bridge::{llm_error, BridgeCall, LlmBridge, LlmCallKind, LlmFailure};
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::client::{ChatMessage, ChatRequest, Completion, LlmClient, LlmError};
use super::stats::LlmCounters;
use super::window::BatchWindow;
use crate::config::LlmConfig;

/// The engine's bridge; cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    jobs: mpsc::UnboundedSender<Job>,
    shared: Arc<Shared>,
}

/// Each prompt's completion, or why it has none.
pub type Answers = Vec<Result<Completion, LlmError>>;

/// A call and where its answers go.
struct Job {
    call: BridgeCall,
    reply: oneshot::Sender<Result<Answers, LlmFailure>>,
}

struct Shared {
    client: Arc<dyn LlmClient>,
    window: BatchWindow,
    engine_permits: Arc<Semaphore>,
    session_concurrency: usize,
    max_pending: usize,
    sessions: Mutex<HashMap<Arc<str>, Arc<SessionGate>>>,
    counters: Arc<LlmCounters>,
}

/// One session's share of the bridge.
struct SessionGate {
    permits: Arc<Semaphore>,
    /// Prompts waiting or in flight; changed under the `sessions` lock.
    pending: std::sync::atomic::AtomicUsize,
}

impl Dispatcher {
    /// Starts the bridge's thread.
    pub fn start(
        client: Arc<dyn LlmClient>,
        config: &LlmConfig,
        counters: Arc<LlmCounters>,
    ) -> std::io::Result<Dispatcher> {
        let shared = Arc::new(Shared {
            client,
            window: BatchWindow::new(config.batch_window),
            engine_permits: Arc::new(Semaphore::new(config.max_concurrency)),
            session_concurrency: config.session_concurrency,
            max_pending: config.max_pending,
            sessions: Mutex::new(HashMap::new()),
            counters,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (jobs, mut received) = mpsc::unbounded_channel::<Job>();
        let serving = shared.clone();
        std::thread::Builder::new()
            .name("pyvisor-llm".into())
            .spawn(move || {
                runtime.block_on(async move {
                    while let Some(Job { call, mut reply }) = received.recv().await {
                        let shared = serving.clone();
                        tokio::spawn(async move {
                            tokio::select! {
                                answers = shared.serve(call) => { let _ = reply.send(answers); }
                                // The caller is gone: drop the requests.
                                () = reply.closed() => {}
                            }
                        });
                    }
                })
            })?;
        Ok(Dispatcher { jobs, shared })
    }

    /// The client the bridge calls, for the task loops.
    pub fn client(&self) -> Arc<dyn LlmClient> {
        self.shared.client.clone()
    }

    /// The completion of each prompt of `call` (of kind `llm` or `llm_batched`), or why the
    /// call was refused before any request.
    pub fn ask(&self, call: BridgeCall) -> BoxFuture<'static, Result<Answers, LlmFailure>> {
        let (reply, answer) = oneshot::channel();
        let sent = self.jobs.send(Job { call, reply });
        Box::pin(async move {
            sent.map_err(|_| llm_error("the engine's LLM bridge has stopped"))?;
            answer
                .await
                .unwrap_or_else(|_| Err(llm_error("the engine's LLM bridge has stopped")))
        })
    }
}

/// The texts of `answers`, or the first failure.
pub fn texts(answers: Answers) -> Result<Vec<String>, LlmFailure> {
    (answers.into_iter())
        .map(|answer| answer.map(|c| c.text).map_err(|e| llm_error(e.to_string())))
        .collect()
}

impl LlmBridge for Dispatcher {
    fn call(&self, call: BridgeCall) -> BoxFuture<'static, Result<Vec<String>, LlmFailure>> {
        if call.kind == LlmCallKind::Rlm {
            let refusal = "rlm_query runs only in the sessions of an rlm task (task.run kind \
                           rlm), whose budget it spends";
            return Box::pin(std::future::ready(Err(llm_error(refusal))));
        }
        let answers = self.ask(call);
        Box::pin(async move { texts(answers.await?) })
    }
}

impl Shared {
    /// Answers one call: each prompt's completion, or why none was asked.
    async fn serve(&self, call: BridgeCall) -> Result<Answers, LlmFailure> {
        let kind = call.kind.as_str();
        let model = (self.client)
            .resolve_model(call.model.as_deref())
            .map_err(|err| llm_error(err.to_string()))?;
        if call.prompts.is_empty() {
            return Ok(Vec::new());
        }
        let gate = self.admit(&call.session_id, call.prompts.len())?;
        let answers = self.send_all(&call, &gate, kind).await;
        self.release(&call.session_id, &gate, call.prompts.len());
        tracing::debug!(session = %call.session_id, model, kind, prompts = answers.len(), "bridge call answered");
        Ok(answers)
    }

    /// Counts `prompts` against the session's `max_pending`, or refuses them.
    fn admit(&self, session: &Arc<str>, prompts: usize) -> Result<Arc<SessionGate>, LlmFailure> {
        use std::sync::atomic::Ordering;
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let gate = sessions.entry(session.clone()).or_insert_with(|| {
            Arc::new(SessionGate {
                permits: Arc::new(Semaphore::new(self.session_concurrency)),
                pending: 0.into(),
            })
        });
        let pending = gate.pending.load(Ordering::Relaxed);
        if pending + prompts > self.max_pending {
            self.counters.refused();
            return Err(llm_error(format!(
                "{prompts} more prompt(s) would exceed the {} this session may have waiting \
                 (llm.max_pending); {pending} are waiting",
                self.max_pending
            )));
        }
        gate.pending.store(pending + prompts, Ordering::Relaxed);
        Ok(gate.clone())
    }

    fn release(&self, session: &Arc<str>, gate: &SessionGate, prompts: usize) {
        use std::sync::atomic::Ordering;
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let left = gate.pending.load(Ordering::Relaxed).saturating_sub(prompts);
        gate.pending.store(left, Ordering::Relaxed);
        if left == 0 {
            sessions.remove(session);
        }
    }

    /// Waits for the batch window, then sends every prompt under the permits.
    async fn send_all(&self, call: &BridgeCall, gate: &SessionGate, kind: &'static str) -> Answers {
        self.window.wait().await;
        let requests = call.prompts.iter().map(|prompt| async {
            let _session = gate.permits.acquire().await.expect("never closed");
            let _engine = self.engine_permits.acquire().await.expect("never closed");
            let request = ChatRequest {
                model: call.model.clone(),
                messages: vec![ChatMessage::new("user", prompt.clone())],
            };
            let outcome = self.client.complete(request).await;
            self.counters.record(kind, &outcome);
            outcome
        });
        join_all(requests).await
    }
}
