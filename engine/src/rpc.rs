//! JSON-RPC 2.0 as SPEC.md §2 defines it, independent of the transport: the wire types,
//! the error codes, the method dispatcher, message handling and line framing.

mod dispatch;
pub mod errors;
pub mod framing;
mod limits;
mod message;
mod outbound;
pub mod wire;

pub use dispatch::Dispatcher;
pub use errors::{code, RpcError};
pub use limits::LimitPolicy;
pub use message::{error_text, oversized, respond};
pub use outbound::{Outbound, OutboundQueue, OUTBOUND_CAPACITY};
