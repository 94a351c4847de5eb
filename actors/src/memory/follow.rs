//! For a store several engines share: the thread that asks it, every few seconds, what the
//! other engines recorded since it last asked, and hands that to the memory, so that a
//! check on this engine knows their failures without ever waiting for the store itself.

use std::sync::Weak;
use std::time::Duration;

use super::store::OutcomeStore;
use super::Memory;

/// Starts the thread that follows `store` from `mark` for `memory`, every `every`; it ends
/// once the memory is gone.
pub(super) fn follow(
    memory: Weak<Memory>,
    mut store: Box<dyn OutcomeStore>,
    mut mark: i64,
    every: Duration,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("pyvisor-memory-follow".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            let Some(memory) = memory.upgrade() else {
                return;
            };
            match store.changes(mark) {
                Ok(Some(changes)) => {
                    mark = changes.mark;
                    memory.absorb(changes);
                }
                // A store of one engine: nobody else writes it.
                Ok(None) => return,
                Err(err) => memory.health.degrade(&err),
            }
        })
        .map(drop)
}
