//! The pump: one task per worker that turns its pipes and its exit into ordered events.
//!
//! It reads frames from fd 4, output from fds 1 and 2, and waits for the process to exit
//! (see [`ExitSource`]).
//! Before it hands over any frame it drains what is already in the output pipes: the worker
//! flushes before every frame, so everything printed before a `result` or `input_request` is
//! delivered before it. After the exit it drains the pipes once more, then reports the exit
//! and ends. A full event channel makes the pump wait, which in turn makes the worker wait.
//! A well-formed frame of a kind this host does not know (a newer worker's) is dropped with a
//! warning, at most one per [`UNKNOWN_WARN_INTERVAL`]; only a frame that cannot be read
//! makes the worker go.

use std::io;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use pyvisor_protocol::{FrameDecoder, FrameError, WorkerMessage};
use serde::Deserialize;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::exit::ExitSource;
use crate::execution::OutputStream;

/// Bytes read from a pipe at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Most bytes taken from one output pipe while draining before a frame. The worker flushes
/// before it writes a frame, so at most a pipe buffer is pending; the bound keeps a child
/// process that writes without pause from starving the frame.
const DRAIN_LIMIT: usize = 4 * 1024 * 1024;
/// Least time between two warnings about frames of unknown kinds from one worker.
const UNKNOWN_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Something the worker process did.
#[derive(Debug)]
pub enum WorkerEvent {
    /// Bytes written to fd 1 or fd 2.
    Output {
        stream: OutputStream,
        bytes: Vec<u8>,
    },
    /// A decoded frame from fd 4.
    Message(WorkerMessage),
    /// Fd 4 can no longer be trusted (garbage, oversize, or closed): the worker must go.
    ProtocolError(String),
    /// The worker process has exited and has been reaped. The status is `None` when it
    /// cannot be known: the zygote that forked the worker, and would have reaped it, is gone.
    Exited(Option<ExitStatus>),
}

/// The host ends of the worker's pipes.
pub(crate) struct PumpPipes {
    pub frames: pipe::Receiver,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
}

/// Runs until the worker has exited and been reaped, or the receiver is gone.
pub(crate) async fn pump(
    mut exit: ExitSource,
    pipes: PumpPipes,
    events: mpsc::Sender<WorkerEvent>,
    max_frame: usize,
) {
    let mut pump = Pump {
        pipes,
        events,
        decoder: FrameDecoder::new(max_frame),
        buffer: vec![0; READ_CHUNK],
        frames_open: true,
        stdout_open: true,
        stderr_open: true,
        unknown: UnknownKinds::default(),
    };
    let status = loop {
        let step = tokio::select! {
            ready = pump.pipes.frames.readable(), if pump.frames_open => {
                ready.map(|_| Step::Frames)
            }
            ready = pump.pipes.stdout.readable(), if pump.stdout_open => {
                ready.map(|_| Step::Output(OutputStream::Stdout))
            }
            ready = pump.pipes.stderr.readable(), if pump.stderr_open => {
                ready.map(|_| Step::Output(OutputStream::Stderr))
            }
            status = exit.wait() => break status,
        };
        let alive = match step {
            Ok(Step::Frames) => pump.read_frames().await,
            Ok(Step::Output(stream)) => {
                pump.read_output(stream, READ_CHUNK, Probe::Readiness).await
            }
            Err(err) => pump.protocol_error(format!("pipe error: {err}")).await,
        };
        if !alive {
            return;
        }
    };
    // The process is gone: deliver what it left in the pipes, then the exit itself.
    if pump.drain_outputs().await && pump.frames_open {
        pump.read_frames().await;
    }
    if let Ok(status) = status {
        let _ = pump.events.send(WorkerEvent::Exited(status)).await;
    }
}

enum Step {
    Frames,
    Output(OutputStream),
}

/// How `read_output` learns that a pipe has bytes.
#[derive(Clone, Copy)]
enum Probe {
    /// tokio saw the pipe readable: its own non-blocking read.
    Readiness,
    /// Before a frame, whatever tokio has seen: a read syscall.
    Kernel,
}

struct Pump {
    pipes: PumpPipes,
    events: mpsc::Sender<WorkerEvent>,
    decoder: FrameDecoder,
    buffer: Vec<u8>,
    frames_open: bool,
    stdout_open: bool,
    stderr_open: bool,
    unknown: UnknownKinds,
}

/// The frames of unknown kinds a worker sent, for rate-limited warnings.
#[derive(Default)]
struct UnknownKinds {
    last_warning: Option<Instant>,
    /// Frames dropped since the last warning.
    unwarned: u64,
}

impl UnknownKinds {
    /// Counts a dropped frame of kind `kind` and warns unless a warning went out recently.
    fn dropped(&mut self, kind: &str) {
        self.unwarned += 1;
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|at| now.duration_since(at) < UNKNOWN_WARN_INTERVAL)
        {
            return;
        }
        tracing::warn!(
            kind,
            dropped = self.unwarned,
            "the worker sent messages of a kind this host does not know; ignoring them"
        );
        self.last_warning = Some(now);
        self.unwarned = 0;
    }
}

/// The kind of a frame, read on its own when the frame's kind is unknown.
#[derive(Deserialize)]
struct Kind {
    #[serde(rename = "type")]
    kind: String,
}

/// Decodes the next frame: `Ok(None)` when more bytes are needed, `Some(None)` for a frame
/// of a kind this host does not know (after counting it in `unknown`).
fn next_message(
    decoder: &mut FrameDecoder,
    unknown: &mut UnknownKinds,
) -> Result<Option<Option<WorkerMessage>>, FrameError> {
    let Some(payload) = decoder.next_payload()? else {
        return Ok(None);
    };
    match serde_json::from_slice(&payload)? {
        WorkerMessage::Unknown => {
            let kind: Kind = serde_json::from_slice(&payload)?;
            unknown.dropped(&kind.kind);
            Ok(Some(None))
        }
        message => Ok(Some(Some(message))),
    }
}

impl Pump {
    /// Reads what fd 4 has and emits every complete frame. Returns false once the
    /// receiver is gone.
    async fn read_frames(&mut self) -> bool {
        loop {
            match self.pipes.frames.try_read(&mut self.buffer) {
                Ok(0) => {
                    self.frames_open = false;
                    let reason = match self.decoder.finish() {
                        Ok(()) => "worker closed its protocol pipe".to_owned(),
                        Err(err) => err.to_string(),
                    };
                    return self.protocol_error(reason).await;
                }
                Ok(n) => {
                    self.decoder.extend(&self.buffer[..n]);
                    if !self.emit_frames().await {
                        return false;
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return true,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    self.frames_open = false;
                    return self.protocol_error(format!("pipe error: {err}")).await;
                }
            }
        }
    }

    async fn emit_frames(&mut self) -> bool {
        loop {
            match next_message(&mut self.decoder, &mut self.unknown) {
                Ok(Some(None)) => {}
                Ok(Some(Some(message))) => {
                    if !self.drain_outputs().await {
                        return false;
                    }
                    if self
                        .events
                        .send(WorkerEvent::Message(message))
                        .await
                        .is_err()
                    {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(err) => {
                    // Nothing after a bad frame can be trusted; stop reading fd 4.
                    self.frames_open = false;
                    return self.protocol_error(err.to_string()).await;
                }
            }
        }
    }

    /// Emits what is already buffered in both output pipes.
    async fn drain_outputs(&mut self) -> bool {
        self.read_output(OutputStream::Stdout, DRAIN_LIMIT, Probe::Kernel)
            .await
            && self
                .read_output(OutputStream::Stderr, DRAIN_LIMIT, Probe::Kernel)
                .await
    }

    /// Reads up to `limit` bytes that are ready on one output pipe, without waiting.
    async fn read_output(&mut self, stream: OutputStream, limit: usize, probe: Probe) -> bool {
        let mut taken = 0;
        while taken < limit {
            let (pipe, open) = match stream {
                OutputStream::Stdout => (&self.pipes.stdout, &mut self.stdout_open),
                OutputStream::Stderr => (&self.pipes.stderr, &mut self.stderr_open),
            };
            if !*open {
                break;
            }
            let read = match probe {
                Probe::Readiness => pipe.try_read(&mut self.buffer),
                // tokio's try_read answers WouldBlock without reading while its readiness
                // flag is clear, and the epoll event of bytes written just before a frame may
                // not have been seen yet: ask the kernel itself (the fd is non-blocking).
                Probe::Kernel => nix::unistd::read(pipe, &mut self.buffer).map_err(io::Error::from),
            };
            match read {
                Ok(0) => *open = false,
                Ok(n) => {
                    taken += n;
                    let bytes = self.buffer[..n].to_vec();
                    if self
                        .events
                        .send(WorkerEvent::Output { stream, bytes })
                        .await
                        .is_err()
                    {
                        return false;
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => *open = false,
            }
        }
        true
    }

    async fn protocol_error(&mut self, reason: String) -> bool {
        self.events
            .send(WorkerEvent::ProtocolError(reason))
            .await
            .is_ok()
    }
}
