//! Writes frames to the worker's fd 3, in order, without blocking the session actor.
//!
//! A frame is written straight into the pipe when nothing is waiting before it, which is
//! the common case and costs no task switch; what the pipe cannot take at once goes to a
//! small task that waits for the pipe to drain. When the worker is gone, writes fail
//! quietly: the pump reports the exit.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyvisor_protocol::{encode_frame, FrameError, HostMessage};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

/// Handle for sending frames to one worker.
#[derive(Debug)]
pub struct FrameWriter {
    pipe: Arc<pipe::Sender>,
    backlog: mpsc::UnboundedSender<Vec<u8>>,
    /// Frames handed to the backlog task and not yet fully written.
    waiting: Arc<AtomicUsize>,
    max_frame: usize,
}

impl FrameWriter {
    /// Starts the backlog task for `pipe` on the current runtime.
    pub(crate) fn start(pipe: pipe::Sender, max_frame: usize) -> Self {
        let pipe = Arc::new(pipe);
        let waiting = Arc::new(AtomicUsize::new(0));
        let (backlog, queue) = mpsc::unbounded_channel();
        tokio::spawn(write_backlog(pipe.clone(), queue, waiting.clone()));
        Self {
            pipe,
            backlog,
            waiting,
            max_frame,
        }
    }

    /// Sends `message` to the worker. Fails only if it does not fit in a frame.
    pub fn send(&self, message: &HostMessage) -> Result<(), FrameError> {
        let frame = encode_frame(message, self.max_frame)?;
        let mut written = 0;
        if self.waiting.load(Ordering::Acquire) == 0 {
            loop {
                match self.pipe.try_write(&frame[written..]) {
                    Ok(n) => written += n,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return Ok(()),
                }
                if written == frame.len() {
                    return Ok(());
                }
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _ = self.backlog.send(frame[written..].to_vec());
        Ok(())
    }
}

/// Writes the frames the pipe could not take at once, in order.
async fn write_backlog(
    pipe: Arc<pipe::Sender>,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
    waiting: Arc<AtomicUsize>,
) {
    while let Some(frame) = queue.recv().await {
        let mut written = 0;
        while written < frame.len() {
            if pipe.writable().await.is_err() {
                return;
            }
            match pipe.try_write(&frame[written..]) {
                Ok(n) => written += n,
                Err(err)
                    if matches!(
                        err.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return,
            }
        }
        waiting.fetch_sub(1, Ordering::AcqRel);
    }
}
