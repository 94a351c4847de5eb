//! The host's side of worker confinement: the engine-wide [`Sandbox`] policy, each worker's
//! [`Confinement`] (its uid lease, its private directories), and the [`SandboxPlan`] the
//! worker applies to itself (pyworker/pyvisor_worker/sandbox.py) before any session code
//! runs. Uids are leased machine-wide ([`uids`]): when the last worker holding one ends,
//! every process still running under it is killed before it goes back to the free set.
//!
//! A worker's directories hang from its nest, `w-N` (root's, 0711): `work`, the default
//! working directory, and `tmp`, its TMPDIR, HOME and MPLCONFIGDIR (0700, its uid's), and the
//! nests of its clones. Landlock lets the worker write beneath its nest, and the engine alone
//! makes entries in it, so no directory the engine works in as root can be swapped for a
//! symlink by session code.
//!
//! A clone of `session.fork` keeps its source's uid (taking another would need a capability
//! that session code could use too). Where Landlock is on, it is isolated from its source and
//! siblings by a layer of its own instead ([`Confinement::for_clone`]): a nest inside its
//! source's (a Landlock layer can only narrow what its process may reach), a checkpoint area
//! of its own, and the rules it applies to itself ([`ClonePlan`]). Without Landlock it shares
//! its source's confinement, directories and all.

mod uids;

use std::fs::{self, DirBuilder};
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use pyvisor_protocol::{ClonePlan, SandboxPlan};

use crate::errors::SpawnError;
use uids::{UidLease, UidPool};

/// Where every engine on the machine claims the worker uids it leases (root's, 0700).
pub const UID_CLAIMS_DIR: &str = "/run/pyvisor-uids";

/// How many forks deep a lineage of clones may go under Landlock: the kernel stacks at most
/// 16 layers on a process, a worker starts with one, and each clone adds one of its own.
pub const MAX_CLONE_GENERATIONS: u32 = 15;

/// Which layers confine the workers of an engine, and where their directories go.
#[derive(Debug)]
pub struct Sandbox {
    uids: Option<Arc<UidPool>>,
    /// Restrict file access with Landlock.
    pub landlock: bool,
    /// Install the seccomp filter.
    pub seccomp: bool,
    /// Where each worker's private directory is made (created 0711: entered, not listed).
    dirs: PathBuf,
    /// Readable by every worker besides the system paths (the worker package is added).
    read: Vec<PathBuf>,
    /// Readable and writable by every worker besides its own directory.
    write: Vec<PathBuf>,
    next_dir: AtomicU64,
}

/// What a [`Sandbox`] is made of.
#[derive(Debug, Clone, Default)]
pub struct SandboxSetup {
    /// Give every worker its own uid from this range (gid = uid); requires root.
    pub uid_range: Option<RangeInclusive<u32>>,
    /// Where the uids are claimed machine-wide ([`UID_CLAIMS_DIR`] but in tests).
    pub uid_claims: PathBuf,
    pub landlock: bool,
    pub seccomp: bool,
    /// Where the workers' private directories are made.
    pub dirs: PathBuf,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
}

impl Sandbox {
    /// The policy of `setup`; creates its directory for worker directories.
    pub fn new(setup: SandboxSetup) -> io::Result<Sandbox> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&setup.dirs)?;
        let uids = match setup.uid_range {
            Some(range) => Some(Arc::new(UidPool::new(range, setup.uid_claims)?)),
            None => None,
        };
        Ok(Sandbox {
            uids,
            landlock: setup.landlock,
            seccomp: setup.seccomp,
            dirs: setup.dirs,
            read: setup.read,
            write: setup.write,
            next_dir: AtomicU64::new(1),
        })
    }

    /// Whether every worker gets a uid of its own.
    pub fn separates_uids(&self) -> bool {
        self.uids.is_some()
    }

    /// A name for a new nest, unique in this engine.
    fn next_nest(&self) -> String {
        format!("w-{}", self.next_dir.fetch_add(1, Ordering::Relaxed))
    }

    /// Leases a uid and makes the directories of one worker that runs `script`, in `cwd`
    /// when given (used as is), else in its own work directory. `None` when no layer is on
    /// and the worker may use the network: such a worker is not confined at all. Without
    /// the network, the seccomp filter is always installed (it refuses the sockets).
    pub(crate) fn prepare(
        self: &Arc<Self>,
        script: &Path,
        cwd: Option<&Path>,
        network: bool,
    ) -> Result<Option<Confinement>, SpawnError> {
        if self.uids.is_none() && !self.landlock && !self.seccomp && network {
            return Ok(None);
        }
        let uid = match &self.uids {
            Some(pool) => Some(Arc::new(pool.lease()?)),
            None => None,
        };
        let nest = self.dirs.join(self.next_nest());
        // Built first, so that a failure below returns the uid and removes what was made.
        let mut confinement = Confinement {
            uid,
            nest: nest.clone(),
            checkpoints: None,
            plan: None,
            generation: 0,
            _source: None,
        };
        let uid = confinement.uid();
        make_worker_dirs(&nest, uid)?;
        let mut read: Vec<String> = self.read.iter().map(|p| text(p)).collect();
        read.push(text(script));
        let mut write: Vec<String> = self.write.iter().map(|p| text(p)).collect();
        write.push(text(&nest));
        write.extend(cwd.map(text));
        confinement.plan = Some(SandboxPlan {
            uid,
            network,
            landlock: self.landlock,
            seccomp: self.seccomp || !network,
            read,
            write,
            cwd: Some(text(cwd.unwrap_or(&nest.join("work")))),
        });
        Ok(Some(confinement))
    }
}

/// A path as the worker's plans carry it.
fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Whether `dir` is a directory without entries (not when it cannot be read).
fn is_empty_dir(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

/// Creates the nest `nest` (root's, 0711) with `work` and `tmp` in it (0700, owned by `uid`
/// when given).
fn make_worker_dirs(nest: &Path, uid: Option<u32>) -> Result<(), SpawnError> {
    let made = (|| {
        DirBuilder::new().mode(0o711).create(nest)?;
        for dir in [nest.join("work"), nest.join("tmp")] {
            DirBuilder::new().mode(0o700).create(&dir)?;
            if let Some(uid) = uid {
                std::os::unix::fs::chown(&dir, Some(uid), Some(uid))?;
            }
        }
        Ok::<_, io::Error>(())
    })();
    made.map_err(|source| SpawnError::Sandbox {
        reason: format!("create {}: {source}", nest.display()),
    })
}

/// One worker's share of the sandbox: its uid lease, its directories and its plan. Dropping
/// it, once the worker is dead, kills whatever still runs under the uid if this was the
/// uid's last holder, removes the directories and frees the uid.
#[derive(Debug)]
pub struct Confinement {
    /// Shared by a worker and its clones; the last holder sweeps and frees it.
    uid: Option<Arc<UidLease>>,
    /// The worker's nest (see the module's doc).
    nest: PathBuf,
    /// An isolated clone's own area for its checkpoint directories (root's, 0711), inside
    /// its source's or the engine's scratch directory; `None` for a spawned worker, which
    /// makes them in the scratch directory itself.
    checkpoints: Option<PathBuf>,
    plan: Option<SandboxPlan>,
    /// How many forks this worker is from a spawned one.
    generation: u32,
    /// An isolated clone's source, whose nest and checkpoint area hold this one's: kept
    /// until this one is removed.
    _source: Option<Arc<Confinement>>,
}

/// A clone's share of the sandbox, from [`Confinement::for_clone`].
#[derive(Debug)]
pub struct CloneConfinement {
    pub confinement: Arc<Confinement>,
    /// The isolation the clone applies to itself; `None` when it shares its source's
    /// confinement (no Landlock).
    pub plan: Option<ClonePlan>,
    /// Whether the clone has files to copy (its source's work directory held some at the
    /// fork): it must be in its own cgroup leaf before it starts, so that they count there.
    pub copies: bool,
}

impl Confinement {
    /// The uid the worker runs as, when it has its own.
    pub fn uid(&self) -> Option<u32> {
        self.uid.as_deref().map(UidLease::uid)
    }

    /// Whether the worker cannot read the checkpoint store (a uid of its own, or Landlock):
    /// a restore must hand it copies of the blobs, in [`Self::checkpoint_dir`].
    pub fn cannot_read_the_store(&self) -> bool {
        self.uid.is_some() || self.plan.as_ref().is_some_and(|plan| plan.landlock)
    }

    /// The worker's working directory: the client's `cwd`, else its own `work` directory.
    pub fn work_dir(&self) -> Option<&str> {
        self.plan.as_ref()?.cwd.as_deref()
    }

    /// The plan the worker applies to itself.
    pub(crate) fn plan(&self) -> Option<&SandboxPlan> {
        self.plan.as_ref()
    }

    /// The worker's private temp dir, as TMPDIR, HOME and MPLCONFIGDIR.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let tmp = text(&self.nest.join("tmp"));
        ["TMPDIR", "HOME", "MPLCONFIGDIR"]
            .into_iter()
            .map(|name| (name.to_owned(), tmp.clone()))
            .collect()
    }

    /// Where a restore hands the worker copies of its checkpoint's blobs: its nest, which
    /// it can write (Landlock) but not make entries in.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.nest.clone()
    }

    /// Where the worker's checkpoint directories are made, when not in the engine's scratch
    /// directory: an isolated clone's own area there.
    pub fn checkpoint_area(&self) -> Option<&Path> {
        self.checkpoints.as_deref()
    }

    /// The share of a new clone of this worker. Under Landlock the clone gets a nest inside
    /// this one's, a checkpoint area inside this one's (or inside `scratch`, the engine's
    /// scratch directory, for a spawned worker; none without checkpoints) and the plan that
    /// isolates it; it keeps the uid. Without Landlock it shares this confinement.
    pub fn for_clone(
        self: &Arc<Self>,
        sandbox: &Sandbox,
        scratch: Option<&Path>,
    ) -> Result<CloneConfinement, SpawnError> {
        let Some(source_plan) = self.plan.as_ref().filter(|plan| plan.landlock) else {
            return Ok(CloneConfinement {
                confinement: self.clone(),
                plan: None,
                copies: false,
            });
        };
        if self.generation >= MAX_CLONE_GENERATIONS {
            return Err(SpawnError::CloneTooDeep {
                limit: MAX_CLONE_GENERATIONS,
            });
        }
        let name = sandbox.next_nest();
        let nest = self.nest.join(&name);
        let mut clone = Confinement {
            uid: self.uid.clone(),
            nest: nest.clone(),
            checkpoints: None,
            plan: None,
            generation: self.generation + 1,
            _source: Some(self.clone()),
        };
        make_worker_dirs(&nest, clone.uid())?;
        if let Some(base) = self.checkpoints.as_deref().or(scratch) {
            let area = base.join(format!("clone-{name}"));
            DirBuilder::new()
                .mode(0o711)
                .create(&area)
                .map_err(|source| SpawnError::Sandbox {
                    reason: format!("create {}: {source}", area.display()),
                })?;
            clone.checkpoints = Some(area);
        }
        let own_work = text(&self.nest.join("work"));
        // A client's cwd is the client's directory: the clone works there too.
        let client_cwd = source_plan.cwd.clone().filter(|cwd| *cwd != own_work);
        let cwd = client_cwd
            .clone()
            .unwrap_or_else(|| text(&nest.join("work")));
        let mut write = vec![text(&nest)];
        write.extend(clone.checkpoints.as_deref().map(text));
        write.extend(client_cwd.clone());
        // `work` is its uid's, in a nest only root can change: it cannot be swapped. A file
        // the source makes after this look is copied before the clone is in its own leaf.
        let copies = client_cwd.is_none() && !is_empty_dir(&self.nest.join("work"));
        let plan = ClonePlan {
            write: write.clone(),
            cwd: cwd.clone(),
            env: clone.env(),
            copy_from: client_cwd.is_none().then_some(own_work),
        };
        clone.plan = Some(SandboxPlan {
            write,
            cwd: Some(cwd),
            ..source_plan.clone()
        });
        Ok(CloneConfinement {
            confinement: Arc::new(clone),
            plan: Some(plan),
            copies,
        })
    }
}

impl Drop for Confinement {
    fn drop(&mut self) {
        // The uid first: when this is its last holder, whatever still runs under it is killed
        // before the directories go. The source's (an Arc field) only after this one's.
        drop(self.uid.take());
        let _ = fs::remove_dir_all(&self.nest);
        if let Some(area) = &self.checkpoints {
            let _ = fs::remove_dir_all(area);
        }
    }
}

/// The kernel's Landlock ABI version; `None` without Landlock (or with it disabled).
pub fn landlock_abi() -> Option<u32> {
    const CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with the VERSION flag the syscall reads no memory and returns a number.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(abi).ok().filter(|abi| *abi > 0)
}

/// Whether the kernel filters syscalls with seccomp (its status line exists).
pub fn seccomp_available() -> bool {
    fs::read_to_string("/proc/self/status")
        .is_ok_and(|status| status.lines().any(|line| line.starts_with("Seccomp:")))
}

/// Checks that `uid` can run `python` on the worker package `script` (every directory on
/// the way must be open to it): the interpreter starts and imports the package's sandbox
/// module as that uid. The error says why not.
pub fn probe_uid(python: &Path, script: &Path, uid: u32) -> Result<(), String> {
    use std::os::unix::process::CommandExt;

    let import = "import sys; sys.path.insert(0, sys.argv[1]); import pyvisor_worker.sandbox";
    let output = std::process::Command::new(python)
        .args(["-I", "-B", "-c", import])
        .arg(script)
        .env_clear()
        .current_dir("/")
        .uid(uid)
        .gid(uid)
        .output()
        .map_err(|err| format!("run {} as uid {uid}: {err}", python.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} cannot run the worker package {} as uid {uid} ({}): {}",
        python.display(),
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    ))
}
