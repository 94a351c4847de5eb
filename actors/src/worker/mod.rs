//! Plumbing for one Python worker process: installing the package, spawning the process with
//! its pipes (or having the zygote fork it), pumping its output and frames, watching for its
//! exit, writing frames to it, and confining it (its own uid, Landlock, seccomp).

mod cgroup;
mod child;
mod clone;
mod exit;
mod janitor;
mod output;
mod pump;
mod sandbox;
mod script;
mod spawn;
mod writer;
mod zygote;

pub use cgroup::{CgroupLeaf, CgroupLimits, CgroupManager, CgroupMechanism};
pub use child::inherited as inherited_by_workers;
pub use exit::{is_running, left_by_dead_processes};
pub use janitor::Janitor;
pub use output::{CappedOutput, Utf8Chunker};
pub use pump::WorkerEvent;
pub use sandbox::{
    landlock_abi, probe_uid, seccomp_available, CloneConfinement, Confinement, Sandbox,
    SandboxSetup, MAX_CLONE_GENERATIONS, UID_CLAIMS_DIR,
};
pub use script::{
    install_worker_package, resolve_interpreter, verify_worker_package, WORKER_FILES,
};
pub use spawn::{Worker, WorkerInfo, WorkerOrigin, WorkerSpec};
pub use writer::{FrameWriter, Sent};
pub use zygote::Zygote;
