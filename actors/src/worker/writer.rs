//! Writes frames to the worker, in order, without blocking the session actor.
//!
//! A worker reads two pipes ([`Lane`]): fd 3, the requests its main thread takes up one at a
//! time, and fd 5, the control messages its control thread serves at once (an interrupt, an
//! `input()` answer). Each frame goes on its message's lane.
//!
//! A frame is written straight into its pipe when nothing is waiting before it, which is
//! the common case and costs no task switch; what the pipe cannot take at once goes to a
//! small task per pipe that waits for the pipe to drain. When the worker is gone, writes fail
//! quietly: the pump reports the exit.
//!
//! The host keeps a read end of the request pipe that it never reads from while the worker
//! lives: once the worker is gone, the bytes left in the pipe say whether it had read a
//! given frame at all ([`FrameWriter::unread`]), so an execution sent to a worker that had
//! already died runs on its replacement instead of being reported lost. That takes no
//! liveness check before each send.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use pyvisor_protocol::{encode_frame, FrameError, HostMessage, Lane};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};

/// Where a frame starts on the request pipe: the bytes sent on it before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent(u64);

/// Handle for sending frames to one worker.
#[derive(Debug)]
pub struct FrameWriter {
    requests: PipeWriter,
    control: PipeWriter,
    /// The host's read end of the request pipe, never read: see [`FrameWriter::unread`].
    requests_read: Option<OwnedFd>,
    max_frame: usize,
}

impl FrameWriter {
    /// Starts the backlog tasks of both pipes on the current runtime. `requests_read` is a
    /// read end of the request pipe that the host keeps, when it has one.
    pub(crate) fn start(
        requests: pipe::Sender,
        control: pipe::Sender,
        requests_read: Option<OwnedFd>,
        max_frame: usize,
    ) -> Self {
        Self {
            requests: PipeWriter::start(requests),
            control: PipeWriter::start(control),
            requests_read,
            max_frame,
        }
    }

    /// Sends `message` to the worker on its lane. Fails only if it does not fit in a frame.
    /// The answer says where the frame starts on the request pipe (for a control message,
    /// where the next request will).
    pub fn send(&self, message: &HostMessage) -> Result<Sent, FrameError> {
        let frame = encode_frame(message, self.max_frame)?;
        match message.lane() {
            Lane::Requests => Ok(Sent(self.requests.send(frame))),
            Lane::Control => {
                self.control.send(frame);
                Ok(Sent(self.requests.queued.load(Ordering::Acquire)))
            }
        }
    }

    /// Whether the worker never read a byte of the request frame sent at `sent`; asked once
    /// the worker is gone, when nothing reads the pipe any more. False when the host keeps no
    /// read end of the pipe (it cannot tell).
    pub fn unread(&self, sent: Sent) -> bool {
        let Some(read_end) = &self.requests_read else {
            return false;
        };
        let mut left: libc::c_int = 0;
        // SAFETY: FIONREAD writes the number of unread bytes into the int it is given.
        if unsafe { libc::ioctl(read_end.as_raw_fd(), libc::FIONREAD, &mut left) } != 0 {
            return false;
        }
        let written = self.requests.written.load(Ordering::Acquire);
        let read = written.saturating_sub(left.max(0) as u64);
        read <= sent.0
    }
}

/// One pipe's writer: direct writes, and a task for what the pipe cannot take at once.
#[derive(Debug)]
struct PipeWriter {
    pipe: Arc<pipe::Sender>,
    backlog: mpsc::UnboundedSender<Vec<u8>>,
    /// Frames handed to the backlog task and not yet fully written.
    waiting: Arc<AtomicUsize>,
    /// Bytes of every frame sent, written or not.
    queued: AtomicU64,
    /// Bytes written into the pipe.
    written: Arc<AtomicU64>,
    /// Ends the backlog task when the writer goes, even while it waits for the pipe.
    _alive: watch::Sender<()>,
}

impl PipeWriter {
    fn start(pipe: pipe::Sender) -> Self {
        let pipe = Arc::new(pipe);
        let waiting = Arc::new(AtomicUsize::new(0));
        let written = Arc::new(AtomicU64::new(0));
        let (backlog, queue) = mpsc::unbounded_channel();
        let (alive, gone) = watch::channel(());
        tokio::spawn(write_backlog(
            pipe.clone(),
            queue,
            waiting.clone(),
            written.clone(),
            gone,
        ));
        Self {
            pipe,
            backlog,
            waiting,
            queued: AtomicU64::new(0),
            written,
            _alive: alive,
        }
    }

    /// Sends `frame`; returns the bytes sent on this pipe before it.
    fn send(&self, frame: Vec<u8>) -> u64 {
        let start = self.queued.fetch_add(frame.len() as u64, Ordering::AcqRel);
        let mut written = 0;
        if self.waiting.load(Ordering::Acquire) == 0 {
            loop {
                match self.pipe.try_write(&frame[written..]) {
                    Ok(n) => {
                        written += n;
                        self.written.fetch_add(n as u64, Ordering::AcqRel);
                    }
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => return start,
                }
                if written == frame.len() {
                    return start;
                }
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _ = self.backlog.send(frame[written..].to_vec());
        start
    }
}

/// Writes the frames the pipe could not take at once, in order, until the writer is gone.
async fn write_backlog(
    pipe: Arc<pipe::Sender>,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
    waiting: Arc<AtomicUsize>,
    written_total: Arc<AtomicU64>,
    mut gone: watch::Receiver<()>,
) {
    while let Some(frame) = queue.recv().await {
        let mut written = 0;
        while written < frame.len() {
            tokio::select! {
                ready = pipe.writable() => if ready.is_err() {
                    return;
                },
                _ = gone.changed() => return,
            }
            match pipe.try_write(&frame[written..]) {
                Ok(n) => {
                    written += n;
                    written_total.fetch_add(n as u64, Ordering::AcqRel);
                }
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
