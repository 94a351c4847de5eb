//! Plumbing for one Python worker process: installing the script, spawning the process with
//! its pipes, pumping its output and frames, and writing frames to it.

mod cgroup;
mod janitor;
mod output;
mod pump;
mod script;
mod spawn;
mod writer;

pub use cgroup::{CgroupLeaf, CgroupLimits, CgroupManager, CgroupMechanism};
pub use janitor::Janitor;
pub use output::{CappedOutput, Utf8Chunker};
pub use pump::WorkerEvent;
pub use script::{install_worker_script, resolve_interpreter, WORKER_SOURCE};
pub use spawn::{Worker, WorkerInfo, WorkerSpec};
pub use writer::FrameWriter;
