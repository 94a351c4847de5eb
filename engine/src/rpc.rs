//! JSON-RPC 2.0 as docs/protocol.md defines it, independent of the transport: the wire types,
//! the error codes, the method dispatcher, message handling and line framing.

#[cfg(feature = "server")]
mod caller;
#[cfg(feature = "server")]
mod client_llm;
#[cfg(feature = "server")]
mod dispatch;
pub mod errors;
pub mod files;
pub mod framing;
#[cfg(feature = "server")]
mod limits;
#[cfg(feature = "server")]
pub mod memory;
#[cfg(feature = "server")]
mod message;
#[cfg(feature = "server")]
mod outbound;
#[cfg(feature = "server")]
mod params;
#[cfg(feature = "server")]
mod peer;
pub mod strict_json;
pub mod task;
pub mod wire;

#[cfg(feature = "server")]
pub use caller::{Caller, MAX_OWNER_BYTES};
#[cfg(feature = "server")]
pub use dispatch::Dispatcher;
pub use errors::{code, RpcError};
#[cfg(feature = "server")]
pub use limits::LimitPolicy;
#[cfg(feature = "server")]
pub use message::{error_text, oversized, respond};
#[cfg(feature = "server")]
pub use outbound::{Outbound, OutboundQueue, OUTBOUND_CAPACITY};
#[cfg(feature = "server")]
pub use params::MAX_NAME_BYTES;
#[cfg(feature = "server")]
pub use peer::{PeerRefusal, PeerReply, PeerRequests};
