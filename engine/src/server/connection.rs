//! One JSON-RPC connection over a byte stream (a Unix socket, or stdin/stdout): reads
//! newline-delimited messages, runs each as its own task so that many requests are in flight
//! at once, and writes responses and notifications in the order they are produced.
//!
//! Everything is bounded: a line by `max_request_bytes` (skipped, answered -32600), the
//! requests in flight by [`MAX_IN_FLIGHT`], the bytes of unwritten messages by
//! [`crate::rpc::OUTBOUND_CAPACITY`]. A client that stops reading first stalls only its own
//! requests; after [`WRITE_STALL`] without progress its connection is closed.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{watch, Semaphore};
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
    let mut writer = tokio::spawn(write_messages(writer, queue));
    let mut lines = framing::lines(reader, max_request_bytes);
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut requests = JoinSet::new();
    let caller = Arc::new(caller);
    loop {
        let frame = tokio::select! {
            frame = lines.next() => frame,
            _ = shutdown.wait_for(|stop| *stop) => break,
            // The writer ends only when the peer is gone or stalled: stop reading too. The
            // requests still running finish on their own; their answers have nowhere to go.
            _ = &mut writer => {
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
        requests.spawn(async move {
            if let Some(reply) = rpc::respond(&dispatcher, &caller, &line, &out).await {
                out.send(reply).await;
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

/// Writes queued messages, one per line, flushing whenever the queue runs dry.
async fn write_messages<W: AsyncWrite + Unpin>(writer: W, mut queue: OutboundQueue) {
    let mut writer = BufWriter::new(writer);
    while let Some(message) = queue.recv().await {
        let written = tokio::time::timeout(WRITE_STALL, async {
            writer.write_all(message.as_bytes()).await?;
            writer.write_all(b"\n").await?;
            if queue.is_empty() {
                writer.flush().await?;
            }
            std::io::Result::Ok(())
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::warn!("closing a connection whose peer stopped reading");
                return;
            }
        }
    }
    let _ = writer.flush().await;
    let _ = writer.shutdown().await;
}
