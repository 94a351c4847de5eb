//! The faults that signal the engine's processes: SIGKILL or SIGSTOP of a client session's
//! worker, SIGKILL and restart of the daemon the harness runs, and SIGKILL of a cluster node,
//! started again after `for_s`, with the failover gap of each session it held.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{recovered, FaultKind, FaultLog, FaultRecord, FaultSpec, Recovery};
use crate::loadtest::target::Target;

/// How long a node killed by `node_kill` stays down unless `for_s` says.
const NODE_DOWN_S: f64 = 10.0;

/// SIGKILL or SIGSTOP/SIGCONT of `session`'s worker.
pub(super) async fn worker_fault(
    spec: &FaultSpec,
    target: &Target,
    session: &str,
) -> Result<(String, String), String> {
    let pid = target
        .worker_pid(session)
        .await?
        .ok_or_else(|| format!("{session} has no worker now"))?;
    let process = Pid::from_raw(i32::try_from(pid).map_err(|err| err.to_string())?);
    let detail = if spec.kind == FaultKind::KillWorker {
        kill(process, Signal::SIGKILL).map_err(|err| format!("kill {pid}: {err}"))?;
        format!("SIGKILL to worker {pid}")
    } else {
        let pause = Duration::from_secs_f64(spec.for_s.unwrap_or(2.0));
        kill(process, Signal::SIGSTOP).map_err(|err| format!("stop {pid}: {err}"))?;
        tokio::time::sleep(pause).await;
        let _ = kill(process, Signal::SIGCONT);
        format!("SIGSTOP of worker {pid} for {pause:?}")
    };
    Ok((session.to_owned(), detail))
}

/// SIGKILL and restart of the daemon, every client's session brought back by its name.
pub(super) async fn daemon_fault(
    target: &Target,
    sessions: &[String],
) -> Result<(String, String), String> {
    let detail = target.kill_and_restart_daemon(sessions).await?;
    let probe = sessions
        .get(fastrand::usize(..sessions.len().max(1)))
        .ok_or_else(|| format!("{detail}; no client session to probe"))?;
    Ok((probe.clone(), detail))
}

/// SIGKILL of the cluster node holding the most of `sessions`, its restart after `for_s`
/// meanwhile, and a recovery probe in each of its sessions: the record, with the failover gap
/// of each session that answered again.
pub(super) async fn node_fault(
    spec: &FaultSpec,
    target: &Target,
    sessions: &[String],
    log: &FaultLog,
    at_s: f64,
) -> FaultRecord {
    let mut record = FaultRecord {
        kind: spec.kind.name(),
        at_s,
        session: None,
        detail: String::new(),
        recovered: false,
        recovery_s: None,
        cut_by_restart: false,
        failover_gaps_s: Vec::new(),
    };
    let Some((cluster, http)) = target.cluster() else {
        record.detail = "the harness does not run this target's cluster".into();
        return record;
    };
    let mut held: Vec<Vec<&String>> = vec![Vec::new(); cluster.len()];
    for session in sessions {
        if let Some(index) = http.holder(session).and_then(|id| cluster.index_of(&id)) {
            held[index].push(session);
        }
    }
    let index = (0..held.len())
        .max_by_key(|&index| (held[index].len(), std::cmp::Reverse(index)))
        .unwrap_or(0);
    let node = cluster.node_id(index).to_owned();
    let pid = match cluster.kill_node(index).await {
        Ok(pid) => pid,
        Err(err) => {
            record.detail = err;
            return record;
        }
    };
    let down = Duration::from_secs_f64(spec.for_s.unwrap_or(NODE_DOWN_S));
    let restart = async {
        tokio::time::sleep(down).await;
        let began = Instant::now();
        let pid = cluster.restart_node(index).await?;
        Ok::<_, String>((pid, began.elapsed()))
    };
    let probes = held[index]
        .iter()
        .map(|session| recovered(target, session, log, || false));
    let (restarted, recoveries) = tokio::join!(restart, futures::future::join_all(probes));
    let mut gaps: Vec<f64> = recoveries
        .iter()
        .filter_map(|recovery| match recovery {
            Recovery::After(took) => Some(took.as_secs_f64()),
            Recovery::Never | Recovery::CutByRestart => None,
        })
        .collect();
    gaps.sort_by(f64::total_cmp);
    let mut detail = format!(
        "SIGKILL to {node} (pid {pid}) holding {} client sessions",
        held[index].len()
    );
    if let (Some(first), Some(last)) = (gaps.first(), gaps.last()) {
        detail.push_str(&format!(
            "; {} answered again on another node after {first:.2}-{last:.2} s",
            gaps.len()
        ));
    }
    match &restarted {
        Ok((pid, took)) => detail.push_str(&format!(
            "; restarted after {down:?} as pid {pid}, ready {:.2} s later",
            took.as_secs_f64()
        )),
        Err(err) => detail.push_str(&format!("; not restarted: {err}")),
    }
    record.recovered = restarted.is_ok() && gaps.len() == held[index].len();
    record.recovery_s = match (record.recovered, gaps.last(), &restarted) {
        (false, ..) => None,
        (true, Some(last), _) => Some(*last),
        // It held no client session: back when the node is.
        (true, None, Ok((_, took))) => Some((down + *took).as_secs_f64()),
        (true, None, Err(_)) => None,
    };
    record.detail = detail;
    record.failover_gaps_s = gaps;
    record
}
