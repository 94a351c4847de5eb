//! Wire types and framing shared by the pyvisor host and its Python workers.
//!
//! The host and a worker talk over two pipes (fd 3: host → worker, fd 4: worker → host).
//! Every message is one frame: a 4-byte big-endian length followed by that many bytes of
//! UTF-8 JSON. [`messages`] defines what travels in a frame; [`frame`] turns bytes into
//! frames and back without ever panicking on hostile input. The zygote, which forks workers,
//! exchanges its own messages (also in [`messages`]) as unframed datagrams on a socket. This
//! crate has no runtime policy: no actix, no tokio, so it can be used by any host or test
//! harness.

pub mod bridge;
pub mod errors;
pub mod frame;
pub mod messages;
pub mod zygote;

pub use bridge::{LlmCallKind, LlmFailure, LlmFailureKind};
pub use errors::FrameError;
pub use frame::{encode_frame, FrameDecoder, DEFAULT_MAX_FRAME_BYTES, FRAME_HEADER_BYTES};
pub use messages::{
    CellFacts, CheckpointGroup, ClonePlan, ColumnSummary, Definition, DisplayItem, ErrorInfo,
    FileStamp, ForkedClone, HostMessage, Lane, LostName, NameStamp, ObjectSummary, RestoreGroup,
    ResultValue, SandboxApplied, SpeculativeOutcome, Transaction, Variable, WorkerMessage,
    WorkerStatus, PROTOCOL_VERSION,
};
pub use zygote::{Rlimit, RlimitResource, SandboxPlan, ZygoteReply, ZygoteRequest};
