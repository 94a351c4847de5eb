//! [`PeerRequests`]: the requests the server sends to the client of one connection
//! (`bridge.llm`), and the routing of the client's responses back to them.
//!
//! Each connection has its own table, so a response reaches only a request of the
//! connection it came in on: another connection, or session code (whose output reaches
//! clients only inside notifications), cannot answer one. Ids are `b1`, `b2`, … per
//! connection. When the connection goes, every request still waiting fails at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::{oneshot, watch};

use super::errors::RpcError;

/// Requests one connection may have waiting for the client at once; more fail at once.
pub const MAX_PEER_REQUESTS: usize = 1024;

/// The client's response: its result, or its error object.
pub type PeerReply = Result<Value, RpcError>;

/// Why a request to the client could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRefusal {
    /// The connection is gone, or cannot carry requests (a plain HTTP request).
    Closed,
    /// [`MAX_PEER_REQUESTS`] are waiting already.
    Full,
}

/// The requests of one connection that wait for the client's response.
#[derive(Debug)]
pub struct PeerRequests {
    next: AtomicU64,
    /// By id; `None` once the connection has hung up.
    waiting: Mutex<Option<HashMap<String, oneshot::Sender<PeerReply>>>>,
    /// True once the connection has hung up (not for one that never took requests).
    hung_up: watch::Sender<bool>,
}

impl PeerRequests {
    /// A table of an open connection.
    pub fn open() -> Self {
        Self {
            next: AtomicU64::new(1),
            waiting: Mutex::new(Some(HashMap::new())),
            hung_up: watch::Sender::new(false),
        }
    }

    /// A table that takes no request (a connection that cannot answer).
    pub fn closed() -> Self {
        Self {
            next: AtomicU64::new(1),
            waiting: Mutex::new(None),
            hung_up: watch::Sender::new(false),
        }
    }

    /// A new request's id and where its response will come.
    pub fn start(&self) -> Result<(String, oneshot::Receiver<PeerReply>), PeerRefusal> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let table = waiting.as_mut().ok_or(PeerRefusal::Closed)?;
        if table.len() >= MAX_PEER_REQUESTS {
            return Err(PeerRefusal::Full);
        }
        let id = format!("b{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        table.insert(id.clone(), tx);
        Ok((id, rx))
    }

    /// Whether requests can be made.
    pub fn is_open(&self) -> bool {
        (self.waiting.lock().unwrap_or_else(|e| e.into_inner())).is_some()
    }

    /// Hands the client's response with `id` to its request; false when none waits for it.
    pub fn answer(&self, id: &Value, reply: PeerReply) -> bool {
        let Some(id) = id.as_str() else { return false };
        let sender = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            waiting.as_mut().and_then(|table| table.remove(id))
        };
        sender.is_some_and(|sender| sender.send(reply).is_ok())
    }

    /// Stops waiting for `id` (given up, or cancelled).
    pub fn forget(&self, id: &str) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(table) = waiting.as_mut() {
            table.remove(id);
        }
    }

    /// The connection is gone: every waiting request fails, and no new one is made.
    pub fn hang_up(&self) {
        let waiting = (self.waiting.lock().unwrap_or_else(|e| e.into_inner())).take();
        drop(waiting);
        self.hung_up.send_replace(true);
    }

    /// Resolves once the connection has hung up.
    pub async fn hung_up(&self) {
        let mut hung_up = self.hung_up.subscribe();
        // The sender lives as long as `self`, so this ends only by the hang-up.
        let _ = hung_up.wait_for(|hung_up| *hung_up).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_response_reaches_the_request_of_its_id_only() {
        let peer = PeerRequests::open();
        let (first, first_rx) = peer.start().unwrap();
        let (second, second_rx) = peer.start().unwrap();
        assert_ne!(first, second);
        assert!(!peer.answer(&Value::from("b999"), Ok(Value::Null)));
        assert!(
            !peer.answer(&Value::from(1), Ok(Value::Null)),
            "ids are strings"
        );
        assert!(peer.answer(&Value::from(second.as_str()), Ok(Value::from(2))));
        assert_eq!(second_rx.await.unwrap(), Ok(Value::from(2)));
        assert!(
            !peer.answer(&Value::from(second.as_str()), Ok(Value::Null)),
            "answered once"
        );
        peer.hang_up();
        peer.hung_up().await;
        assert!(first_rx.await.is_err(), "a hang-up fails what waits");
        assert_eq!(peer.start().unwrap_err(), PeerRefusal::Closed);
    }

    #[test]
    fn the_table_is_bounded_and_a_closed_one_takes_nothing() {
        let peer = PeerRequests::open();
        let held: Vec<_> = (0..MAX_PEER_REQUESTS)
            .map(|_| peer.start().unwrap())
            .collect();
        assert_eq!(peer.start().unwrap_err(), PeerRefusal::Full);
        peer.forget(&held[0].0);
        assert!(peer.start().is_ok());
        assert_eq!(
            PeerRequests::closed().start().unwrap_err(),
            PeerRefusal::Closed
        );
    }
}
