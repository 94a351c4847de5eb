//! One JSON-RPC connection over a byte stream (a Unix socket, or stdin/stdout): reads
//! newline-delimited messages, runs each as its own task so that many requests are in flight
//! at once, and writes responses and notifications in the order they are produced.
//!
//! Messages go through the connection's [`Outbound`] queue to its writer task, except a reply
//! that finds the queue written out and the stream free: the request's task writes it itself,
//! which spares the hand-over to the writer task (ordering is kept: whatever was queued before
//! it, such as its own execution's output notifications, is already written).
//!
//! Everything is bounded: a line by `max_request_bytes` (skipped, answered -32600), the
//! requests in flight by [`MAX_IN_FLIGHT`], the bytes of unwritten messages by
//! [`crate::rpc::OUTBOUND_CAPACITY`]. A client that stops reading first stalls only its own
//! requests; after [`WRITE_STALL`] without progress its connection is closed.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{watch, Mutex, Notify, Semaphore};
use tokio::task::JoinSet;

use crate::rpc::framing::{self, Frame};
use crate::rpc::{self, Caller, Dispatcher, Outbound, OutboundQueue, OUTBOUND_CAPACITY};

/// Requests of one connection running at once; the next line is read when one ends.
pub const MAX_IN_FLIGHT: usize = 256;

/// How long a write may make no progress before the connection is dropped.
pub const WRITE_STALL: Duration = Duration::from_secs(30);

/// Serves one connection of `caller` until the peer closes its side and every answer is
/// written, the peer stops reading for [`WRITE_STALL`], or `shutdown` turns true.
pub async fn serve_connection<R, W>(
    dispatcher: Arc<Dispatcher>,
    caller: Caller,
    reader: R,
    writer: W,
    max_request_bytes: usize,
    mut shutdown: watch::Receiver<bool>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, queue) = Outbound::new(OUTBOUND_CAPACITY);
    let sink = Arc::new(Sink {
        stream: Mutex::new(BufWriter::new(writer)),
        broken: Notify::new(),
    });
    let mut writer = tokio::spawn(write_messages(sink.clone(), queue));
    let mut lines = framing::lines(reader, max_request_bytes);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut requests = JoinSet::new();
    let caller = Arc::new(caller);
    loop {
        let frame = tokio::select! {
            frame = lines.next() => frame,
            _ = shutdown.wait_for(|stop| *stop) => break,
            // The writer ends only when the peer is gone or stalled (as a request's own write
            // finds it): stop reading too. The requests still running finish on their own;
            // their answers have nowhere to go.
            _ = async { tokio::select! { _ = &mut writer => {}, () = sink.broken.notified() => {} } } => {
                out.peer().hang_up();
                requests.detach_all();
                return;
            }
        };
        // Reap finished request tasks so the set stays small on long connections.
        while requests.try_join_next().is_some() {}
        let line = match frame {
            Some(Ok(Frame::Line(line))) => line,
            Some(Ok(Frame::Oversized)) => {
                if !out.send(rpc::oversized(max_request_bytes)).await {
                    break;
                }
                continue;
            }
            None | Some(Err(_)) => break,
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let dispatcher = dispatcher.clone();
        let caller = caller.clone();
        let out = out.clone();
        let sink = sink.clone();
        requests.spawn(async move {
            if let Some(reply) = rpc::respond(&dispatcher, &caller, &line, &out).await {
                if !sink.write_now(&reply, &out).await {
                    out.send(reply).await;
                }
            }
            drop(permit);
        });
    }
    // Nothing more will come from the peer: what waits for its answer fails. It may have
    // closed only its writing side: answer what it asked.
    out.peer().hang_up();
    while requests.join_next().await.is_some() {}
    drop(out);
    let _ = writer.await;
}

/// The connection's writing side, shared by its writer task and the request tasks that write
/// their own reply.
struct Sink<W> {
    stream: Mutex<BufWriter<W>>,
    /// Told once a request's own write found the peer gone or stalled.
    broken: Notify,
}

impl<W: AsyncWrite + Unpin> Sink<W> {
    /// Writes `reply` at once when nobody writes and every queued message is out; false when
    /// it must be queued instead. A failed write counts as done: the connection is broken,
    /// and the main loop hears of it.
    async fn write_now(&self, reply: &str, out: &Outbound) -> bool {
        let Ok(mut stream) = self.stream.try_lock() else {
            return false;
        };
        // Checked under the lock: the writer marks a message written only after writing it
        // (and flushing, when nothing followed it), so nothing queued earlier is still due.
        if !out.all_written() {
            return false;
        }
        if write_line(&mut stream, reply, true).await.is_err() {
            self.broken.notify_one();
        }
        true
    }
}

/// Writes one message and its newline, flushing when asked; fails when the peer is gone or
/// makes no progress for [`WRITE_STALL`].
async fn write_line<W: AsyncWrite + Unpin>(
    stream: &mut BufWriter<W>,
    message: &str,
    flush: bool,
) -> std::io::Result<()> {
    let written = tokio::time::timeout(WRITE_STALL, async {
        stream.write_all(message.as_bytes()).await?;
        stream.write_all(b"\n").await?;
        if flush {
            stream.flush().await?;
        }
        std::io::Result::Ok(())
    })
    .await;
    match written {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!("closing a connection whose peer stopped reading");
            Err(std::io::ErrorKind::TimedOut.into())
        }
    }
}

/// Writes queued messages, one per line, flushing whenever the queue runs dry.
async fn write_messages<W: AsyncWrite + Unpin>(sink: Arc<Sink<W>>, mut queue: OutboundQueue) {
    while let Some(message) = queue.recv().await {
        let mut stream = sink.stream.lock().await;
        let written = write_line(&mut stream, &message, queue.is_empty()).await;
        queue.mark_written();
        if written.is_err() {
            return;
        }
    }
    let mut stream = sink.stream.lock().await;
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    fn sink(capacity: usize) -> (Arc<Sink<tokio::io::DuplexStream>>, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(capacity);
        let sink = Arc::new(Sink {
            stream: Mutex::new(BufWriter::new(ours)),
            broken: Notify::new(),
        });
        (sink, theirs)
    }

    async fn read_exactly(peer: &mut tokio::io::DuplexStream, len: usize) -> String {
        let mut bytes = vec![0; len];
        peer.read_exact(&mut bytes).await.expect("read the lines");
        String::from_utf8(bytes).expect("utf-8")
    }

    #[tokio::test]
    async fn a_reply_is_written_at_once_only_behind_nothing_queued() {
        let (sink, mut peer) = sink(1024);
        let (out, mut queue) = Outbound::new(OUTBOUND_CAPACITY);
        assert!(out.send("queued".into()).await);
        assert!(
            !sink.write_now("reply", &out).await,
            "a message queued before the reply is still unwritten"
        );
        // The writer takes the queued message but has not written it yet.
        let message = queue.recv().await.expect("the queued message");
        assert!(!sink.write_now("reply", &out).await);
        let mut stream = sink.stream.lock().await;
        write_line(&mut stream, &message, true)
            .await
            .expect("write");
        queue.mark_written();
        assert!(
            !sink.write_now("reply", &out).await,
            "the writer holds the stream"
        );
        drop(stream);
        assert!(sink.write_now("reply", &out).await);
        assert_eq!(read_exactly(&mut peer, 13).await, "queued\nreply\n");
    }

    #[tokio::test]
    async fn a_reply_that_finds_the_peer_gone_says_the_connection_is_broken() {
        let (sink, peer) = sink(64);
        let (out, _queue) = Outbound::new(OUTBOUND_CAPACITY);
        drop(peer);
        let broken = sink.broken.notified();
        assert!(
            sink.write_now("reply", &out).await,
            "the reply is done with"
        );
        tokio::time::timeout(Duration::from_secs(5), broken)
            .await
            .expect("the main loop hears of the broken connection");
    }
}
