//! [`Outbound`]: the queue of one connection's outgoing messages (responses and
//! notifications, each one JSON text), drained in order by the connection's writer.

use serde::Serialize;
use tokio::sync::mpsc;

/// Messages a connection may hold for a slow reader before its requests wait.
pub const OUTBOUND_CAPACITY: usize = 256;

/// The sending side of a connection's outgoing queue. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbound {
    tx: mpsc::Sender<String>,
}

impl Outbound {
    /// A queue of `capacity` messages and the receiver its writer drains.
    pub fn new(capacity: usize) -> (Self, mpsc::Receiver<String>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Self { tx }, rx)
    }

    /// A queue nobody reads: notifications sent to it are dropped (plain HTTP requests).
    pub fn closed() -> Self {
        let (tx, _) = mpsc::channel(1);
        Self { tx }
    }

    /// Queues one message; waits while the queue is full. False when the connection is gone.
    pub async fn send(&self, message: String) -> bool {
        self.tx.send(message).await.is_ok()
    }

    /// Queues a JSON-RPC notification. False when the connection is gone.
    pub async fn notify(&self, method: &str, params: &impl Serialize) -> bool {
        #[derive(Serialize)]
        struct Notification<'a, P> {
            jsonrpc: &'static str,
            method: &'a str,
            params: P,
        }
        let message = Notification {
            jsonrpc: "2.0",
            method,
            params,
        };
        match serde_json::to_string(&message) {
            Ok(text) => self.send(text).await,
            Err(_) => false,
        }
    }
}
