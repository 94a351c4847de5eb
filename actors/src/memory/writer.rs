//! The store's own thread: writes arrive on a channel and are applied in batches (what
//! comes within 50 ms of a first write), in transactions of up to 512 writes, so that no
//! execution ever waits for the disk. A store that fails (full, locked, read-only,
//! corrupted) loses the batch and the memory goes on from what it holds in memory, with one
//! warning that says why.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::store::{OutcomeStore, StoreError, Write};

/// Most writes in one transaction.
const MAX_BATCH: usize = 512;
/// How long the first write of a batch waits for others: a few transactions (writes to the
/// WAL) per this interval, rather than one per execution.
const LINGER: Duration = Duration::from_millis(50);

enum Command {
    Write(Write),
    /// Answer once everything sent before is applied (or lost).
    Flush(mpsc::Sender<()>),
}

/// How the store is doing, shared with whoever reports it.
#[derive(Debug, Default)]
pub(crate) struct Health {
    warning: Mutex<Option<String>>,
    pub written: AtomicU64,
    pub lost: AtomicU64,
}

impl Health {
    /// Memory goes on without (part of) its store: warn once.
    pub fn degrade(&self, err: &StoreError) {
        let mut warning = self.warning.lock().unwrap_or_else(|e| e.into_inner());
        if warning.is_none() {
            let message = format!(
                "{err}; memory goes on with what it holds in memory, and what it learns may \
                 not survive a restart"
            );
            tracing::warn!("{message}");
            *warning = Some(message);
        }
    }

    /// The warning, once the store has failed.
    pub fn warning(&self) -> Option<String> {
        self.warning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The sending side of the store's thread.
pub(crate) struct Writer {
    commands: Option<mpsc::Sender<Command>>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread that owns `store`.
    pub fn start(mut store: Box<dyn OutcomeStore>, health: Arc<Health>) -> std::io::Result<Self> {
        let (commands, received) = mpsc::channel::<Command>();
        let thread = std::thread::Builder::new()
            .name("pyvisor-memory".into())
            .spawn(move || {
                while let Ok(first) = received.recv() {
                    // Whatever comes within LINGER of a first write shares its transaction;
                    // sleeping rather than waiting on the channel spares the senders a
                    // wake-up per write.
                    if matches!(first, Command::Write(_)) {
                        std::thread::sleep(LINGER);
                    }
                    let mut batch = Vec::new();
                    let mut flushes = Vec::new();
                    for command in std::iter::once(first).chain(received.try_iter()) {
                        match command {
                            Command::Write(write) => batch.push(write),
                            Command::Flush(done) => flushes.push(done),
                        }
                    }
                    for chunk in batch.chunks(MAX_BATCH) {
                        match store.apply(chunk) {
                            Ok(()) => health
                                .written
                                .fetch_add(chunk.len() as u64, Ordering::Relaxed),
                            Err(err) => {
                                health.degrade(&err);
                                health.lost.fetch_add(chunk.len() as u64, Ordering::Relaxed)
                            }
                        };
                    }
                    for done in flushes {
                        let _ = done.send(());
                    }
                }
            })?;
        Ok(Self {
            commands: Some(commands),
            thread: Some(thread),
        })
    }

    pub fn send(&self, write: Write) {
        if let Some(commands) = &self.commands {
            let _ = commands.send(Command::Write(write));
        }
    }

    /// Waits until every write sent so far is applied (or lost). Blocking.
    pub fn flush(&self) {
        let Some(commands) = &self.commands else {
            return;
        };
        let (done, applied) = mpsc::channel();
        if commands.send(Command::Flush(done)).is_ok() {
            let _ = applied.recv();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // The thread applies what is queued, then ends as the channel closes.
        self.commands.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
