//! Recording a task's completions and replaying them offline. Every completion a task gets
//! (its loops' replies, its sessions' `llm_query` and `llm_query_batched`, its nested loops')
//! is kept as a [`RecordedCall`] under a key of the messages it answered; a [`ReplayClient`]
//! answers the same messages with the same replies, in order, and anything else with an error
//! that says where the replay diverged. The code runs again for real; only the model is
//! replayed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::llm::{ChatMessage, ChatRequest, Completion, LlmClient, LlmError, Usage};

/// One completion of a task, as saved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedCall {
    /// xxh3-128 of the messages answered, in hex.
    pub key: String,
    /// The model id that answered.
    pub model: String,
    pub answer: String,
    pub usage: Usage,
    pub cost: f64,
}

/// A task's completions so far; shared by its loops and its sessions' bridges.
#[derive(Clone, Default)]
pub(crate) struct Recorder(Arc<Mutex<Vec<RecordedCall>>>);

impl Recorder {
    /// Keeps `completion`, the answer to `messages`.
    pub fn record(&self, messages: &[ChatMessage], completion: &Completion) {
        let call = RecordedCall {
            key: key(messages),
            model: completion.model.clone(),
            answer: completion.text.clone(),
            usage: completion.usage,
            cost: completion.cost,
        };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(call);
    }

    /// Everything kept so far, in order.
    pub fn calls(&self) -> Vec<RecordedCall> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The key of a request: its messages, hashed.
fn key(messages: &[ChatMessage]) -> String {
    let text = serde_json::to_vec(messages).expect("messages serialize");
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&text))
}

/// An [`LlmClient`] that answers from a task's recorded completions.
pub struct ReplayClient {
    answers: Mutex<HashMap<String, VecDeque<RecordedCall>>>,
    asked: std::sync::atomic::AtomicUsize,
}

impl ReplayClient {
    /// A client answering with `calls` (those of one saved task).
    pub fn new(calls: Vec<RecordedCall>) -> Self {
        let mut answers: HashMap<String, VecDeque<RecordedCall>> = HashMap::new();
        for call in calls {
            answers.entry(call.key.clone()).or_default().push_back(call);
        }
        Self {
            answers: Mutex::new(answers),
            asked: Default::default(),
        }
    }
}

impl LlmClient for ReplayClient {
    fn complete(&self, request: ChatRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        use std::sync::atomic::Ordering;
        let number = self.asked.fetch_add(1, Ordering::Relaxed) + 1;
        let found = (self.answers.lock().unwrap_or_else(|e| e.into_inner()))
            .get_mut(&key(&request.messages))
            .and_then(VecDeque::pop_front);
        let outcome = found
            .map(|call| Completion {
                text: call.answer,
                model: call.model,
                usage: call.usage,
                cost: call.cost,
                attempts: 1,
                duration: Duration::ZERO,
            })
            .ok_or_else(|| {
                LlmError::BadAnswer(format!(
                    "the replay diverged at completion {number}: the recording has no answer \
                     to these messages (the code ran differently this time)"
                ))
            });
        Box::pin(std::future::ready(outcome))
    }

    fn resolve_model(&self, name: Option<&str>) -> Result<String, LlmError> {
        Ok(name.unwrap_or("replay").to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replay_answers_the_same_messages_in_order_and_nothing_else() {
        let recorder = Recorder::default();
        let asked = vec![ChatMessage::new("user", "hi")];
        for text in ["first", "second"] {
            let completion = Completion {
                text: text.into(),
                model: "m".into(),
                usage: Usage::default(),
                cost: 0.5,
                attempts: 1,
                duration: Duration::ZERO,
            };
            recorder.record(&asked, &completion);
        }
        let replay = ReplayClient::new(recorder.calls());
        let request = |text: &str| ChatRequest {
            model: None,
            messages: vec![ChatMessage::new("user", text)],
        };
        let block = |future: BoxFuture<'static, _>| futures::executor::block_on(future);
        assert_eq!(block(replay.complete(request("hi"))).unwrap().text, "first");
        assert_eq!(
            block(replay.complete(request("hi"))).unwrap().text,
            "second"
        );
        let diverged = block(replay.complete(request("hi"))).unwrap_err();
        assert!(diverged.to_string().contains("diverged at completion 3"));
        assert!(block(replay.complete(request("other"))).is_err());
    }
}
