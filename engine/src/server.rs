//! The daemon side of pyvisor: `pyvisor serve` and the transports that carry the JSON-RPC
//! of [`crate::rpc`] (a Unix socket, stdin/stdout, HTTP and WebSocket), plus its systemd
//! integration.

mod connection;
mod connection_threads;
pub mod http;
pub mod lifecycle;
mod stdio;
pub mod systemd;
mod unix;

pub use http::{HttpAccess, OwnerToken};
pub use lifecycle::{serve, HttpListen, Listen, Reload, Reloader, ServeOptions};
pub use unix::{SocketAccess, UnixServer};
