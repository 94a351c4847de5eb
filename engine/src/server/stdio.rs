//! `pyvisor serve --stdio`: the JSON-RPC of the Unix socket on the process's own stdin and
//! stdout, for a host program that starts pyvisor as its child. Stdout carries nothing but
//! JSON-RPC messages; logs go to stderr. The caller is whoever started the process: an
//! admin.

use std::sync::Arc;

use tokio::sync::watch;

use super::connection::serve_connection;
use crate::rpc::{Caller, Dispatcher};

/// Serves stdin/stdout as one connection until stdin ends (and every answer is written)
/// or `shutdown` turns true.
pub async fn serve_stdio(
    dispatcher: Arc<Dispatcher>,
    max_request_bytes: usize,
    shutdown: watch::Receiver<bool>,
) {
    serve_connection(
        dispatcher,
        Caller::admin(),
        tokio::io::stdin(),
        tokio::io::stdout(),
        max_request_bytes,
        shutdown,
    )
    .await;
}
