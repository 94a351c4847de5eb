//! JSON-RPC 2.0 as docs/protocol.md defines it, independent of the transport: the wire types,
//! the error codes, the method dispatcher, message handling and line framing.

mod caller;
mod dispatch;
pub mod errors;
pub mod framing;
mod limits;
pub mod memory;
mod message;
mod outbound;
mod params;
pub mod strict_json;
pub mod task;
pub mod wire;

pub use caller::{Caller, MAX_OWNER_BYTES};
pub use dispatch::Dispatcher;
pub use errors::{code, RpcError};
pub use limits::LimitPolicy;
pub use message::{error_text, oversized, respond};
pub use outbound::{Outbound, OutboundQueue, OUTBOUND_CAPACITY};
pub use params::MAX_NAME_BYTES;
