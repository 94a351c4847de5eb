//! Writes frames to the worker's fd 3, in order, without blocking the session actor.
//!
//! A small task owns the pipe; the actor hands it encoded frames through a channel. When the
//! worker is gone the task ends and later frames are dropped: the pump reports the exit.

use pyvisor_protocol::{encode_frame, FrameError, HostMessage};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

/// Handle for sending frames to one worker.
#[derive(Debug, Clone)]
pub struct FrameWriter {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    max_frame: usize,
}

impl FrameWriter {
    /// Starts the writer task for `pipe` on the current runtime.
    pub(crate) fn start(mut pipe: pipe::Sender, max_frame: usize) -> Self {
        let (frames, mut queue) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(frame) = queue.recv().await {
                if pipe.write_all(&frame).await.is_err() {
                    break;
                }
            }
        });
        Self { frames, max_frame }
    }

    /// Queues `message` for the worker. Fails only if it does not fit in a frame.
    pub fn send(&self, message: &HostMessage) -> Result<(), FrameError> {
        let frame = encode_frame(message, self.max_frame)?;
        // A closed channel means the worker is gone; its exit is reported by the pump.
        let _ = self.frames.send(frame);
        Ok(())
    }
}
