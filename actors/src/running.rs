//! The execution a session is running right now: its capture buffers, timers and the
//! channel to its caller, and how it turns into an [`ExecutionResult`].

use std::time::{Duration, Instant};

use actix::SpawnHandle;

use crate::execution::{
    DisplayData, ErrorInfo, ExecuteRequest, ExecutionEvent, ExecutionResult, ExecutionStatus,
    OutputStream, Recovered, ResultValue,
};
use crate::memory::Insight;
use crate::session::{EventSender, ExecutionTicket, Progress, Queued, ServePath};
use crate::worker::{CappedOutput, Sent, Utf8Chunker};

/// Why the host interrupted an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InterruptCause {
    /// The caller asked for it.
    User,
    /// The execution ran past its timeout.
    Timeout(Duration),
}

impl InterruptCause {
    /// The status of an execution that stopped because of this interrupt.
    pub fn status(self) -> ExecutionStatus {
        match self {
            InterruptCause::User => ExecutionStatus::Interrupted,
            InterruptCause::Timeout(_) => ExecutionStatus::Timeout,
        }
    }
}

/// State of the execution in progress.
pub(crate) struct Running {
    pub ticket: ExecutionTicket,
    pub request: ExecuteRequest,
    pub events: EventSender,
    pub started: Instant,
    pub output: CappedOutput,
    pub stdout_decoder: Utf8Chunker,
    pub stderr_decoder: Utf8Chunker,
    pub display: Vec<DisplayData>,
    pub interrupt: Option<InterruptCause>,
    /// The timeout timer.
    pub timer: SpawnHandle,
    /// Set while the code waits in `input()`: the timer that answers EOF.
    pub pending_input: Option<SpawnHandle>,
    /// What the session recovered from a checkpoint, to report with this result.
    pub recovered: Option<Recovered>,
    /// What the result says about the session's durable state.
    pub warnings: Vec<String>,
    /// How the execution gets its answer: from the worker or from speculation.
    pub path: ServePath,
    /// The prediction source whose speculative answer served it.
    pub served_by: Option<&'static str>,
    /// What the memory found in the code before it ran.
    pub insights: Vec<Insight>,
    /// Where the execute frame starts on the worker's request pipe, once sent: if the worker
    /// dies without having read it, the code never ran and goes back to the queue for the
    /// next worker.
    pub sent: Option<Sent>,
    /// The code has ended and its result waits for the checkpoint of what it changed
    /// (`durability = "reply"`): there is nothing left to interrupt or time out.
    pub saving: bool,
}

impl Running {
    pub fn new(queued: Queued, output_budget: usize, timer: SpawnHandle) -> Self {
        Self {
            ticket: queued.ticket,
            request: queued.request,
            events: queued.events,
            started: Instant::now(),
            output: CappedOutput::new(output_budget),
            stdout_decoder: Utf8Chunker::default(),
            stderr_decoder: Utf8Chunker::default(),
            display: Vec::new(),
            interrupt: None,
            timer,
            pending_input: None,
            recovered: None,
            warnings: Vec::new(),
            path: ServePath::Real,
            served_by: None,
            insights: Vec::new(),
            sent: None,
            saving: false,
        }
    }

    /// The execution as it was queued, to run on another worker; its timer is the caller's
    /// to cancel.
    pub fn into_queued(self) -> Queued {
        Queued {
            ticket: self.ticket,
            request: self.request,
            events: self.events,
        }
    }

    /// Records output within the cap and streams the kept part to the caller.
    pub fn push_output(&mut self, stream: OutputStream, bytes: &[u8]) {
        let decoder = match stream {
            OutputStream::Stdout => &mut self.stdout_decoder,
            OutputStream::Stderr => &mut self.stderr_decoder,
        };
        let text = decoder.decode(bytes);
        self.keep_output(stream, &text);
    }

    fn keep_output(&mut self, stream: OutputStream, text: &str) {
        let kept = self.output.push(stream == OutputStream::Stderr, text);
        if !kept.is_empty() && self.request.stream {
            let _ = self.events.send(Progress::Event(ExecutionEvent::Output {
                stream,
                data: kept.to_owned(),
            }));
        }
    }

    /// Records a display for the result and streams it to the caller.
    pub fn push_display(&mut self, display: DisplayData) {
        if self.request.stream {
            let _ = self
                .events
                .send(Progress::Event(ExecutionEvent::Display(display.clone())));
        }
        self.display.push(display);
    }

    /// Builds the result and sends it to the caller as the last event.
    pub fn into_result(
        mut self,
        status: ExecutionStatus,
        result: Option<ResultValue>,
        error: Option<ErrorInfo>,
    ) {
        let stdout_tail = self.stdout_decoder.finish();
        self.keep_output(OutputStream::Stdout, &stdout_tail);
        let stderr_tail = self.stderr_decoder.finish();
        self.keep_output(OutputStream::Stderr, &stderr_tail);
        let (stdout, stderr) = self.output.into_parts();
        let result = ExecutionResult {
            execution_id: self.ticket.execution_id,
            execution_count: self.ticket.execution_count,
            status,
            stdout,
            stderr,
            result,
            display: self.display,
            error,
            duration_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            from_cache: self.served_by.is_some(),
            recovered: self.recovered,
            warnings: self.warnings,
            insights: self.insights,
            node: None,
        };
        let _ = self
            .events
            .send(Progress::Event(ExecutionEvent::Finished(Box::new(result))));
    }
}
