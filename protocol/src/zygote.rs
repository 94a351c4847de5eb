//! The messages between the host and the zygote (the fork server that starts workers):
//! [`ZygoteRequest`] and [`ZygoteReply`] travel on the zygote's control socket, one per
//! datagram and unframed, JSON objects tagged by a `type` field; pyworker's zygote.py
//! documents the same shapes from the Python side.

use serde::{Deserialize, Serialize};

/// A request from the host to the zygote (fork server), on its control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ZygoteRequest {
    /// Fork a worker. The datagram carries the child's fds 0-5 (stdin, stdout, stderr,
    /// request pipe, reply pipe, control pipe) as `SCM_RIGHTS`, in that order.
    Fork {
        id: u64,
        /// Working directory of the child; the zygote's when `None`.
        cwd: Option<String>,
        /// Environment variables set in the child on top of the zygote's.
        env: Vec<(String, String)>,
        /// Limits the child sets on itself before it waits for [`HostMessage::Start`](crate::HostMessage::Start).
        rlimits: Vec<Rlimit>,
        /// Confinement the child applies to itself before it waits for
        /// [`HostMessage::Start`](crate::HostMessage::Start); none when `None`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<SandboxPlan>,
    },
}

/// How a worker confines itself before any session code runs (pyvisor_worker/sandbox.py):
/// given to a spawned worker as `--sandbox JSON`, to a forked one in its fork request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// The uid (and gid) the worker becomes; it stays the host's when `None`.
    pub uid: Option<u32>,
    /// False: no network (a new network namespace when root, and seccomp refusing
    /// AF_INET, AF_INET6 and AF_PACKET sockets).
    pub network: bool,
    /// Restrict file access with Landlock, when the kernel has it.
    pub landlock: bool,
    /// Install the seccomp filter.
    pub seccomp: bool,
    /// Paths readable besides the system ones, the interpreter's and `sys.path`.
    pub read: Vec<String>,
    /// Paths readable and writable.
    pub write: Vec<String>,
    /// The working directory, entered once the uid is dropped.
    pub cwd: Option<String>,
}

/// A message from the zygote to the host, on its control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ZygoteReply {
    /// Sent once, when the preload modules are imported and forks can be served.
    Ready { pid: u32 },
    /// The zygote cannot go on (a preload import failed, or its loop broke) and exits.
    Failed { reason: String },
    /// The fork request `id` made the child `pid`, now waiting for its start frame.
    Forked { id: u64, pid: u32 },
    /// The fork request `id` made no child.
    ForkFailed { id: u64, reason: String },
    /// A child has exited and been reaped; `status` is the raw wait status.
    Exited { pid: u32, status: i32 },
}

/// One resource limit: `soft` and `hard` as `setrlimit` takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    pub resource: RlimitResource,
    pub soft: u64,
    pub hard: u64,
}

/// The resource limits a worker may be given (`RLIMIT_<NAME>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RlimitResource {
    Core,
    Cpu,
    Nofile,
    As,
    Nproc,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::HostMessage;

    #[test]
    fn zygote_messages_use_the_documented_shapes() {
        let request = ZygoteRequest::Fork {
            id: 7,
            cwd: None,
            env: vec![("A".into(), "1".into())],
            rlimits: vec![Rlimit {
                resource: RlimitResource::Nofile,
                soft: 256,
                hard: 256,
            }],
            sandbox: None,
        };
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"type":"fork","id":7,"cwd":null,"env":[["A","1"]],"rlimits":[{"resource":"nofile","soft":256,"hard":256}]}"#
        );
        let reply: ZygoteReply =
            serde_json::from_str(r#"{"type":"exited","pid":12,"status":9}"#).unwrap();
        assert_eq!(reply, ZygoteReply::Exited { pid: 12, status: 9 });
        assert_eq!(
            serde_json::to_string(&HostMessage::Start).unwrap(),
            r#"{"type":"start"}"#
        );
        assert_eq!(
            serde_json::to_string(&HostMessage::Interrupt { id: "e-1".into() }).unwrap(),
            r#"{"type":"interrupt","id":"e-1"}"#
        );
    }
}
