//! The LLM calls of a session's code: each [`WorkerMessage::LlmCall`] goes to the session's
//! [`LlmBridge`] (the engine's, a task's, or, in a session whose client answers its calls,
//! the one the running execution's request carries) on a future of the actor, and its answer
//! back to the worker as an `llm_reply`. A call lives only as long as the execution that made it: when the execution
//! ends (finished, interrupted, timed out, crashed) the calls still pending are cancelled,
//! which drops their requests, and the threads that wait for them get an `LlmError`.
//!
//! [`WorkerMessage::LlmCall`]: pyvisor_protocol::WorkerMessage::LlmCall

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use pyvisor_protocol::{HostMessage, LlmCallKind, LlmFailure};

use super::{SessionActor, State};
use crate::bridge::{llm_error, BridgeCall, LlmBridge};

/// A session's tie to the engine's LLM bridge.
#[derive(Clone)]
pub struct LlmLink {
    /// What answers the calls; `None`: the client that started the running execution, through
    /// the answerer its request carries.
    pub bridge: Option<Arc<dyn LlmBridge>>,
    /// The session's owner (`""` for sessions without one).
    pub owner: Arc<str>,
}

/// The calls in flight, by the worker's call number.
#[derive(Default)]
pub(super) struct LlmCalls {
    pending: HashMap<u64, SpawnHandle>,
}

/// A call as the worker sent it.
pub(super) struct CallFrame {
    pub execution_id: String,
    pub call: u64,
    pub kind: LlmCallKind,
    pub prompts: Vec<String>,
    pub model: Option<String>,
    pub context: Option<serde_json::Value>,
}

impl SessionActor {
    /// Hands a call of the worker to the bridge, or refuses it at once.
    pub(super) fn llm_call(&mut self, frame: CallFrame, ctx: &mut Context<Self>) {
        let call = frame.call;
        let Some(link) = self.setup.llm.clone() else {
            let refusal = "this session has no LLM bridge (create it with llm: true)";
            return self.llm_reply(call, Err(llm_error(refusal)));
        };
        let running = match &self.state {
            State::Busy(running) if running.ticket.execution_id == frame.execution_id => running,
            _ => {
                let refusal = "no execution of this session is running";
                return self.llm_reply(call, Err(llm_error(refusal)));
            }
        };
        let bridge = match (link.bridge, &running.request.llm) {
            (Some(bridge), _) => bridge,
            (None, Some(answerer)) => answerer.0.clone(),
            (None, None) => {
                let refusal = "this session's LLM calls are answered by its client, and the \
                               request that started this execution has no client to answer \
                               them (run it over the socket, stdio or a WebSocket)";
                return self.llm_reply(call, Err(llm_error(refusal)));
            }
        };
        if self.llm_calls.pending.contains_key(&call) {
            return self.kill_worker(format!("a second LLM call numbered {call}"));
        }
        let generation = self.generation;
        let future = bridge.call(BridgeCall {
            session_id: self.session_id.as_str().into(),
            owner: link.owner.clone(),
            execution_id: frame.execution_id,
            kind: frame.kind,
            prompts: frame.prompts,
            model: frame.model,
            context: frame.context,
        });
        let handle = ctx.spawn(future.into_actor(self).map(move |outcome, act, _| {
            if act.generation == generation && act.llm_calls.pending.remove(&call).is_some() {
                act.llm_reply(call, outcome);
            }
        }));
        self.llm_calls.pending.insert(call, handle);
    }

    /// Cancels every pending call; each waiting thread gets an `LlmError` saying `reason`.
    pub(super) fn cancel_llm_calls(&mut self, reason: &str, ctx: &mut Context<Self>) {
        let pending = std::mem::take(&mut self.llm_calls.pending);
        for (call, handle) in pending {
            ctx.cancel_future(handle);
            self.llm_reply(call, Err(llm_error(reason)));
        }
    }

    /// Tells the worker that a new worker's code has the bridge.
    pub(super) fn enable_llm(&self) {
        if let (Some(_), Some(worker)) = (&self.setup.llm, &self.worker) {
            let _ = worker.writer.send(&HostMessage::LlmEnable);
        }
    }

    fn llm_reply(&self, call: u64, outcome: Result<Vec<String>, LlmFailure>) {
        let Some(worker) = &self.worker else { return };
        let (answers, error) = match outcome {
            Ok(answers) => (answers, None),
            Err(failure) => (Vec::new(), Some(failure)),
        };
        let _ = worker.writer.send(&HostMessage::LlmReply {
            call,
            answers,
            error,
        });
    }
}
