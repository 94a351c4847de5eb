//! The daemon side of pyvisor: `pyvisor serve` and the transports that carry the JSON-RPC
//! of [`crate::rpc`] (a Unix socket, stdin/stdout, HTTP and WebSocket), plus its systemd
//! integration.

mod connection;
pub mod daemon;
pub mod http;
mod stdio;
pub mod systemd;
mod unix;

pub use daemon::{serve, HttpListen, Listen, Reload, Reloader, ServeOptions};
pub use http::{HttpAccess, OwnerToken};
pub use unix::{SocketAccess, UnixServer};
