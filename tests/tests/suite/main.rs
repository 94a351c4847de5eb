//! The integration suite: real Python workers driven through the public API, one module per
//! area, in one test binary (one link instead of one per file, and the slow tests of one area
//! run beside those of another). Tests that need the process to themselves have binaries of
//! their own: those that install the process-wide metrics recorder (`tests/tests/metrics.rs`,
//! `tests/tests/llm_metrics.rs`) and the one that measures the process's peak memory
//! (`tests/tests/output_cap.rs`).
//!
//! Run one area with `cargo test -p pyvisor-tests --test suite state::`.

mod completion;
mod concurrency;
mod containment;
mod durability;
mod fork;
mod fork_isolation;
mod host_killed;
mod interrupts_and_crashes;
mod isolation;
mod limits;
mod llm_bridge;
mod llm_client;
mod llm_rlm;
mod llm_task;
mod llm_task_remote;
mod memory;
mod memory_embedder;
mod memory_store;
mod output_and_input;
mod pool;
mod proactive;
mod proactive_equivalence;
mod rich_output;
mod session_basics;
mod state;
mod stress;
mod supervisor;
