//! The client-answered bridge (`session.create` with `llm: "client"`): each `llm_query`,
//! `llm_query_batched` or `rlm_query` of a session's code goes to the client connection that
//! started the running execution, as a `bridge.llm` request from the server; the client's
//! result `{answers, usage?}` is the answer, its error raises `LlmError`.
//!
//! A call fails (never hangs) when the connection is gone or goes, or when no answer comes
//! within `[llm] client_timeout_s`; when its execution ends first (interrupt, timeout) the
//! session drops the call, and the client gets `bridge.cancel {call_id}`, as it does after a
//! timeout. Usage the client reports counts in the engine's LLM totals.

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use pyvisor_actors::bridge::{llm_error, BridgeCall, LlmBridge, LlmFailure, SessionBridge};
use serde::Serialize;

use super::outbound::{Outbound, WeakOutbound};
use super::peer::{PeerRefusal, PeerReply};
use super::wire::notification::{BRIDGE_CANCEL, BRIDGE_LLM};
use super::wire::{BridgeCancelParams, BridgeLlmAnswers, BridgeLlmParams};
use crate::config::ClientLlmConfig;
use crate::llm::{BatchWindow, Completion, LlmCounters, LlmError, Usage};

/// What every connection's answerers share: the settings, the batch window, the totals.
pub struct ClientBridge {
    config: ClientLlmConfig,
    window: BatchWindow,
    counters: Arc<LlmCounters>,
}

impl ClientBridge {
    pub fn new(config: ClientLlmConfig, counters: Arc<LlmCounters>) -> Arc<Self> {
        Arc::new(Self {
            window: BatchWindow::new(config.batch_window),
            config,
            counters,
        })
    }

    /// The answerer of an execution started over the connection of `out`; `None` when that
    /// connection cannot answer requests (a plain HTTP request).
    pub fn answerer(self: &Arc<Self>, out: &Outbound) -> Option<SessionBridge> {
        out.peer().is_open().then(|| {
            SessionBridge(Arc::new(Answerer {
                shared: self.clone(),
                out: out.downgrade(),
            }))
        })
    }
}

/// Answers one execution's calls through its client. It holds the connection weakly: an
/// execution that outlives its connection must not keep the connection's writer open.
struct Answerer {
    shared: Arc<ClientBridge>,
    out: WeakOutbound,
}

impl LlmBridge for Answerer {
    fn call(&self, call: BridgeCall) -> BoxFuture<'static, Result<Vec<String>, LlmFailure>> {
        let Some(out) = self.out.upgrade() else {
            return Box::pin(std::future::ready(Err(gone())));
        };
        Box::pin(ask(self.shared.clone(), out, call))
    }
}

fn gone() -> LlmFailure {
    llm_error("the client connection that ran this code is gone")
}

/// Sends `call` to the client and waits for its answers.
async fn ask(
    shared: Arc<ClientBridge>,
    out: Outbound,
    call: BridgeCall,
) -> Result<Vec<String>, LlmFailure> {
    let (call_id, reply) = out.peer().start().map_err(|refusal| match refusal {
        PeerRefusal::Closed => gone(),
        PeerRefusal::Full => llm_error("the client has too many calls waiting for its answer"),
    })?;
    // From here on, giving up (or being dropped) tells the client.
    let mut pending = Pending {
        out: out.clone(),
        call_id: call_id.clone(),
        armed: true,
    };
    shared.window.wait().await;
    let prompts = call.prompts.len();
    let params = BridgeLlmParams {
        session_id: call.session_id.to_string(),
        execution_id: call.execution_id,
        call_id: call_id.clone(),
        kind: call.kind,
        prompts: call.prompts,
        depth: 0,
        model: call.model.clone(),
        context: call.context,
    };
    if !out.send(request(&call_id, BRIDGE_LLM, &params)).await {
        pending.armed = false;
        return Err(gone());
    }
    let started = Instant::now();
    let kind = call.kind.as_str();
    let reply: PeerReply = match tokio::time::timeout(shared.config.timeout, reply).await {
        Err(_) => {
            shared
                .counters
                .record(kind, &Err(LlmError::Timeout(shared.config.timeout)));
            return Err(llm_error(format!(
                "the client did not answer within {:?} (llm.client_timeout_s)",
                shared.config.timeout
            )));
        }
        Ok(Err(_)) => {
            pending.armed = false;
            return Err(llm_error("the client connection closed before it answered"));
        }
        Ok(Ok(reply)) => {
            pending.armed = false;
            reply
        }
    };
    let answered = reply
        .map_err(|error| format!("the client answered with an error: {}", error.message))
        .and_then(|result| {
            serde_json::from_value::<BridgeLlmAnswers>(result)
                .map_err(|err| format!("the client's answer is not {{answers, usage?}}: {err}"))
        })
        .and_then(|answered| match answered.answers.len() == prompts {
            true => Ok(answered),
            false => Err(format!(
                "the client answered {} prompt(s) with {} answer(s)",
                prompts,
                answered.answers.len()
            )),
        });
    let answered = match answered {
        Ok(answered) => answered,
        Err(message) => {
            shared
                .counters
                .record(kind, &Err(LlmError::BadAnswer(message.clone())));
            return Err(llm_error(message));
        }
    };
    let usage = answered.usage;
    for (index, text) in answered.answers.iter().enumerate() {
        // The reply's usage is the whole call's: count it once.
        let usage = usage.filter(|_| index == 0);
        let completion = Completion {
            text: text.clone(),
            model: call.model.clone().unwrap_or_else(|| "client".into()),
            usage: usage.map_or_else(Usage::default, |u| Usage {
                input_tokens: u.input_tokens,
                output_tokens: u.output_tokens,
            }),
            cost: usage
                .and_then(|u| u.cost)
                .filter(|c| c.is_finite() && *c >= 0.0)
                .unwrap_or(0.0),
            attempts: 1,
            duration: started.elapsed(),
        };
        shared.counters.record(kind, &Ok(completion));
    }
    Ok(answered.answers)
}

/// A request sent to the client; while armed, dropping it forgets the request and tells the
/// client with `bridge.cancel`.
struct Pending {
    out: Outbound,
    call_id: String,
    armed: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.out.peer().forget(&self.call_id);
        if self.armed {
            let params = BridgeCancelParams {
                call_id: self.call_id.clone(),
            };
            // A notice only: when the queue is full, the client learns from the call's end.
            self.out.try_send(notification(BRIDGE_CANCEL, &params));
        }
    }
}

fn request(id: &str, method: &str, params: &impl Serialize) -> String {
    let request =
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    request.to_string()
}

fn notification(method: &str, params: &impl Serialize) -> String {
    let note = serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params});
    note.to_string()
}
