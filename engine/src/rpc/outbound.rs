//! [`Outbound`]: the queue of one connection's outgoing messages (responses, notifications
//! and the server's own requests, each one JSON text), drained in order by the connection's
//! writer; it carries the connection's [`PeerRequests`], which route the client's responses.
//!
//! The queue is bounded by bytes, not messages: one answer may carry 10 MiB of output, so a
//! client that stops reading could otherwise pin gigabytes. A sender waits while the queue
//! is full; the writer gives up on a peer that makes no progress, which frees the queue.
//!
//! It also counts the messages queued and not yet written, so that a writer beside the
//! queue's (a request's task writing its own reply) can tell when writing now keeps every
//! message queued before it ahead of it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::peer::PeerRequests;

/// Bytes of unwritten messages one connection may hold before its senders wait.
pub const OUTBOUND_CAPACITY: usize = 32 * 1024 * 1024;

/// The queue's unit of accounting: permits are KiB, so that a `u32` counts them.
const UNIT: usize = 1024;

/// The sending side of a connection's outgoing queue. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbound {
    tx: mpsc::UnboundedSender<(String, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
    /// The most permits one message takes: a message larger than the queue still passes,
    /// alone.
    max_units: u32,
    /// The server's requests to this connection's client that wait for its response.
    peer: Arc<PeerRequests>,
    /// Messages queued and not yet written out by the queue's writer.
    unwritten: Arc<AtomicUsize>,
}

/// An [`Outbound`] that does not keep the connection's writer waiting for more: what outlives
/// a request (the answerer of an execution's LLM calls) holds this.
#[derive(Debug, Clone)]
pub struct WeakOutbound {
    tx: mpsc::WeakUnboundedSender<(String, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
    max_units: u32,
    peer: Arc<PeerRequests>,
    unwritten: Arc<AtomicUsize>,
}

impl WeakOutbound {
    /// The queue, while the connection's own handles to it live.
    pub fn upgrade(&self) -> Option<Outbound> {
        Some(Outbound {
            tx: self.tx.upgrade()?,
            room: self.room.clone(),
            max_units: self.max_units,
            peer: self.peer.clone(),
            unwritten: self.unwritten.clone(),
        })
    }
}

/// The receiving side, drained by the connection's writer.
#[derive(Debug)]
pub struct OutboundQueue {
    rx: mpsc::UnboundedReceiver<(String, OwnedSemaphorePermit)>,
    unwritten: Arc<AtomicUsize>,
}

impl Outbound {
    /// A queue of at most `capacity_bytes` and the receiver its writer drains.
    pub fn new(capacity_bytes: usize) -> (Self, OutboundQueue) {
        let units = (capacity_bytes / UNIT).clamp(1, u32::MAX as usize / 2);
        let (tx, rx) = mpsc::unbounded_channel();
        let unwritten = Arc::new(AtomicUsize::new(0));
        let outbound = Self {
            tx,
            room: Arc::new(Semaphore::new(units)),
            max_units: units as u32,
            peer: Arc::new(PeerRequests::open()),
            unwritten: unwritten.clone(),
        };
        (outbound, OutboundQueue { rx, unwritten })
    }

    /// A queue nobody reads: messages sent to it are dropped (plain HTTP requests), and no
    /// request can be made of its client.
    pub fn closed() -> Self {
        Self::one_way(UNIT).0
    }

    /// A queue of at most `capacity_bytes` that carries notifications only: no request can be
    /// made of its client, which has no way to answer one (a streamed HTTP response).
    pub fn one_way(capacity_bytes: usize) -> (Self, OutboundQueue) {
        let (mut out, queue) = Self::new(capacity_bytes);
        out.peer = Arc::new(PeerRequests::closed());
        (out, queue)
    }

    /// A handle that does not keep the queue open.
    pub fn downgrade(&self) -> WeakOutbound {
        WeakOutbound {
            tx: self.tx.downgrade(),
            room: self.room.clone(),
            max_units: self.max_units,
            peer: self.peer.clone(),
            unwritten: self.unwritten.clone(),
        }
    }

    /// The server's requests to this connection's client.
    pub fn peer(&self) -> &PeerRequests {
        &self.peer
    }

    /// The same table, for what routes answers to it from elsewhere (a bridged stream's
    /// answers, which another node brings).
    pub fn shared_peer(&self) -> Arc<PeerRequests> {
        self.peer.clone()
    }

    /// Whether nothing reads the queue any more (or never did: a plain HTTP request).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves once the connection is gone: its writer stopped reading the queue, or its
    /// client hung up.
    pub async fn gone(&self) {
        tokio::select! {
            () = self.tx.closed() => {}
            () = self.peer.hung_up() => {}
        }
    }

    /// Queues one message if there is room now, without waiting. False when there is none
    /// or the connection is gone.
    pub fn try_send(&self, message: String) -> bool {
        let units = (message.len() / UNIT + 1).min(self.max_units as usize) as u32;
        match self.room.clone().try_acquire_many_owned(units) {
            Ok(permit) => self.enqueue(message, permit),
            Err(_) => false,
        }
    }

    /// Queues one message; waits while the queue is full. False when the connection is gone.
    pub async fn send(&self, message: String) -> bool {
        if self.tx.is_closed() {
            return false;
        }
        let units = (message.len() / UNIT + 1).min(self.max_units as usize) as u32;
        let Ok(permit) = self.room.clone().acquire_many_owned(units).await else {
            return false;
        };
        self.enqueue(message, permit)
    }

    /// Counts the message as unwritten before it is in the queue, so that the count never
    /// misses a message the writer may take.
    fn enqueue(&self, message: String, permit: OwnedSemaphorePermit) -> bool {
        self.unwritten.fetch_add(1, Ordering::AcqRel);
        let sent = self.tx.send((message, permit)).is_ok();
        if !sent {
            self.unwritten.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Whether every message queued so far has been written out by the queue's writer.
    pub fn all_written(&self) -> bool {
        self.unwritten.load(Ordering::Acquire) == 0
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

impl OutboundQueue {
    /// The next message; its bytes leave the queue's account. `None` once every sender is
    /// gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<String> {
        self.rx.recv().await.map(|(message, _room)| message)
    }

    /// Whether no message is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Says that the message [`recv`](Self::recv) gave last is written out (or dropped for
    /// good): [`Outbound::all_written`] counts it no more.
    pub fn mark_written(&self) {
        self.unwritten.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_full_queue_makes_senders_wait_until_the_writer_takes_a_message() {
        let (out, mut queue) = Outbound::new(4 * UNIT);
        assert!(out.send("a".repeat(3 * UNIT)).await);
        let blocked = tokio::time::timeout(Duration::from_millis(50), out.send("b".repeat(UNIT)));
        assert!(blocked.await.is_err(), "the queue is full");
        assert_eq!(queue.recv().await.map(|m| m.len()), Some(3 * UNIT));
        assert!(out.send("b".repeat(UNIT)).await);
    }

    #[tokio::test]
    async fn a_message_larger_than_the_queue_still_passes() {
        let (out, mut queue) = Outbound::new(2 * UNIT);
        assert!(out.send("x".repeat(10 * UNIT)).await);
        assert_eq!(queue.recv().await.map(|m| m.len()), Some(10 * UNIT));
    }

    #[tokio::test]
    async fn sends_fail_once_the_queue_is_gone() {
        let (out, queue) = Outbound::new(UNIT);
        drop(queue);
        assert!(!out.send("x".into()).await);
        assert!(!Outbound::closed().notify("m", &()).await);
    }

    #[tokio::test]
    async fn a_connection_is_gone_when_its_queue_closes_or_its_client_hangs_up() {
        let (out, queue) = Outbound::new(UNIT);
        assert!(!out.is_closed());
        drop(queue);
        out.gone().await;
        assert!(out.is_closed());
        let (out, _queue) = Outbound::new(UNIT);
        out.peer().hang_up();
        out.gone().await;
        assert!(Outbound::closed().is_closed());
    }
}
