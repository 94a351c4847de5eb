//! What the zygote thread and the zygote say over their socket: fork requests out, with the
//! child's fds attached, and replies in (ready, forked, exited, failed), each routed to whoever
//! waits for it.

use std::io::IoSlice;
use std::mem;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::socket::{recv, sendmsg, ControlMessage, MsgFlags};
use pyvisor_protocol::{ZygoteReply, ZygoteRequest};
use tokio::sync::oneshot;

use super::{ForkOrder, ForkReply, Forked, Server, State};
use crate::errors::SpawnError;
use crate::worker::spawn::kill_group;

/// Largest reply datagram read from the zygote.
const REPLY_BUFFER: usize = 64 * 1024;

impl Server {
    /// Passes a fork request on to the zygote, or answers it at once when there is none.
    pub(super) fn fork(&mut self, order: ForkOrder, reply: ForkReply) {
        let refuse = |reply: ForkReply, reason: String| {
            let _ = reply.send(Err(SpawnError::Zygote { reason }));
        };
        let control = match &self.state {
            State::Ready { process } => process.control.as_raw_fd(),
            State::Starting { .. } => return refuse(reply, "it is starting".into()),
            State::Down => {
                let reason = format!("it is down ({})", self.last_failure);
                if Instant::now() >= self.retry_at {
                    tracing::info!(preload = ?self.preload, "restarting the zygote");
                    if let Err(err) = self.launch() {
                        self.down(err.to_string());
                    }
                }
                return refuse(reply, reason);
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let ForkOrder {
            fds,
            cwd,
            env,
            rlimits,
            sandbox,
        } = order;
        let request = ZygoteRequest::Fork {
            id,
            cwd,
            env,
            rlimits,
            sandbox,
        };
        let payload = match serde_json::to_vec(&request) {
            Ok(payload) => payload,
            Err(err) => return refuse(reply, format!("encode the fork request: {err}")),
        };
        let raw: [RawFd; 6] = fds.each_ref().map(|fd| fd.as_raw_fd());
        let sent = sendmsg::<()>(
            control,
            &[IoSlice::new(&payload)],
            &[ControlMessage::ScmRights(&raw)],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            None,
        );
        // The zygote has its own copies now; ours close here, so the host sees EOF later.
        drop(fds);
        match sent {
            Ok(_) => {
                self.pending.insert(id, reply);
            }
            Err(errno) => refuse(reply, format!("send the fork request: {errno}")),
        }
    }

    /// Reads and handles every reply the zygote has sent; takes it down if it is gone.
    pub(super) fn read_replies(&mut self) {
        let Some(process) = self.state.process() else {
            return;
        };
        let mut buffer = vec![0u8; REPLY_BUFFER];
        let mut replies = Vec::new();
        let closed = loop {
            match recv(
                process.control.as_raw_fd(),
                &mut buffer,
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) => break Some("it closed its socket".to_owned()),
                Ok(n) => match serde_json::from_slice::<ZygoteReply>(&buffer[..n]) {
                    Ok(reply) => replies.push(reply),
                    Err(err) => break Some(format!("it sent a malformed reply: {err}")),
                },
                Err(Errno::EAGAIN) => break None,
                Err(Errno::EINTR) => continue,
                Err(errno) => break Some(format!("its socket failed: {errno}")),
            }
        };
        // What the zygote said before it went (a failed preload) explains more than the end.
        let mut failed = None;
        for reply in replies {
            if let Some(reason) = self.on_reply(reply) {
                failed.get_or_insert(reason);
            }
        }
        if let Some(reason) = failed.or(closed) {
            self.down(reason);
        }
    }

    /// Handles one reply; returns why the zygote must go, if it must.
    fn on_reply(&mut self, reply: ZygoteReply) -> Option<String> {
        match reply {
            ZygoteReply::Ready { .. } => {
                let State::Starting { process, .. } = mem::replace(&mut self.state, State::Down)
                else {
                    return Some("it said ready twice".into());
                };
                self.pid.store(process.pid, Ordering::Release);
                self.failures = 0;
                tracing::info!(pid = process.pid, preload = ?self.preload, "zygote ready");
                self.state = State::Ready { process };
            }
            ZygoteReply::Failed { reason } => return Some(format!("it failed: {reason}")),
            ZygoteReply::Forked { id, pid } => {
                let (watcher, exit) = oneshot::channel();
                let delivered = match self.pending.remove(&id) {
                    Some(reply) => reply.send(Ok(Forked { pid, exit })).is_ok(),
                    None => false,
                };
                if delivered {
                    self.watchers.insert(pid, watcher);
                } else {
                    // Nobody waits for this child any more (the caller timed out): it is still
                    // blocked before its start frame, so ending it loses nothing.
                    kill_group(pid);
                }
            }
            ZygoteReply::ForkFailed { id, reason } => {
                if let Some(reply) = self.pending.remove(&id) {
                    let _ = reply.send(Err(SpawnError::Zygote {
                        reason: format!("it could not fork: {reason}"),
                    }));
                }
            }
            ZygoteReply::Exited { pid, status } => {
                if let Some(watcher) = self.watchers.remove(&pid) {
                    let _ = watcher.send(status);
                }
            }
        }
        None
    }
}
