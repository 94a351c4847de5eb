//! The threads that serve the Unix socket's connections: each runs a single-threaded tokio
//! runtime of its own, and connections are dealt to them in turn, as actix-web deals HTTP
//! connections to its workers.
//!
//! Why not the daemon's multi-threaded runtime: its workers steal work from each other, and
//! to keep one of them looking for work they wake each other on every request and every
//! answer coming back from a session's thread. Counted per `x = 1` round trip over the socket
//! (`/proc/<pid>/task/*/status`, 5,000 round trips), its two workers switched 5.0 times; one
//! thread that owns the connection switches 3.3 times (it wakes for the request and for the
//! session's answer), and the round trip took about a quarter less. A connection never moves
//! between threads, so what a busy connection does cannot delay another thread's.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A fixed set of connection threads, each with its own single-threaded runtime.
#[derive(Debug)]
pub struct ConnectionThreads {
    threads: Vec<ConnectionThread>,
    next: AtomicUsize,
}

#[derive(Debug)]
struct ConnectionThread {
    runtime: Handle,
    /// Dropped to stop the thread.
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ConnectionThreads {
    /// Starts `count` threads (at least one).
    pub fn start(count: usize) -> io::Result<Self> {
        let threads = (0..count.max(1))
            .map(ConnectionThread::start)
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Self {
            threads,
            next: AtomicUsize::new(0),
        })
    }

    /// The runtime of the thread whose turn it is to take a connection.
    pub fn next_runtime(&self) -> &Handle {
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.threads.len();
        &self.threads[turn].runtime
    }
}

impl ConnectionThread {
    fn start(index: usize) -> io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("pyvisor-conn-{index}"))
            .spawn(move || {
                let _ = runtime.block_on(stopped);
                // Connections still open end with the thread; a blocking read of theirs
                // must not hold it.
                runtime.shutdown_background();
            })?;
        Ok(Self {
            runtime: handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for ConnectionThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_dealt_to_every_thread_in_turn_and_run_there() {
        let threads = ConnectionThreads::start(2).expect("start two threads");
        let names: Vec<String> = (0..4)
            .map(|_| {
                let task = threads
                    .next_runtime()
                    .spawn(async { std::thread::current().name().unwrap_or_default().to_owned() });
                futures::executor::block_on(task).expect("the task runs")
            })
            .collect();
        assert_eq!(
            names,
            [
                "pyvisor-conn-0",
                "pyvisor-conn-1",
                "pyvisor-conn-0",
                "pyvisor-conn-1"
            ]
        );
    }

    #[test]
    fn dropping_the_threads_ends_their_tasks() {
        let threads = ConnectionThreads::start(1).expect("start a thread");
        let (_keep, never) = oneshot::channel::<()>();
        let task = threads.next_runtime().spawn(never);
        drop(threads);
        let ended = futures::executor::block_on(task);
        assert!(ended.is_err_and(|err| err.is_cancelled()));
    }
}
