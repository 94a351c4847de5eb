//! The cluster's metrics (docs/metrics.md, "Cluster"): leases by event, forwarded requests,
//! failovers and the time of the store's statements, recorded through the `metrics` facade.

use std::future::Future;
use std::time::Instant;

pub const LEASES_TOTAL: &str = "pyvisor_cluster_leases_total";
pub const FORWARDED_TOTAL: &str = "pyvisor_cluster_forwarded_total";
pub const FAILOVERS_TOTAL: &str = "pyvisor_cluster_failovers_total";
pub const STORE_SECONDS: &str = "pyvisor_cluster_store_seconds";

/// What happened to leases this node held or took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEvent {
    /// A lease this node started: a session it created, or one it took over or took back.
    Claimed,
    /// A lease a heartbeat extended.
    Renewed,
    /// A lease another node took while this one held it (it was paused or cut off).
    Lost,
    /// A lease that ran out by this node's clock because the store could not renew it.
    Expired,
}

impl LeaseEvent {
    fn label(self) -> &'static str {
        match self {
            LeaseEvent::Claimed => "claimed",
            LeaseEvent::Renewed => "renewed",
            LeaseEvent::Lost => "lost",
            LeaseEvent::Expired => "expired",
        }
    }
}

/// Counts `count` leases that went through `event`.
pub fn leases(event: LeaseEvent, count: u64) {
    if count > 0 {
        metrics::counter!(LEASES_TOTAL, "event" => event.label()).increment(count);
    }
}

/// Counts a request sent on to the node holding its session and answered there.
pub fn forwarded() {
    metrics::counter!(FORWARDED_TOTAL).increment(1);
}

/// Counts a session taken over from a node whose lease ran out.
pub fn failover() {
    metrics::counter!(FAILOVERS_TOTAL).increment(1);
}

/// Runs `work` against the store and records its time under `op`.
pub async fn timed<T>(op: &'static str, work: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = work.await;
    metrics::histogram!(STORE_SECONDS, "op" => op).record(started.elapsed().as_secs_f64());
    out
}

/// Describes the `pyvisor_cluster_*` metrics to the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        LEASES_TOTAL,
        "Session leases of this node, by event (claimed, renewed, lost, expired)."
    );
    describe_counter!(
        FORWARDED_TOTAL,
        "Requests sent on to the node holding their session and answered there."
    );
    describe_counter!(
        FAILOVERS_TOTAL,
        "Sessions taken over from a node whose lease ran out."
    );
    describe_histogram!(
        STORE_SECONDS,
        Unit::Seconds,
        "Time of the cluster store's work, by op (register, claim, heartbeat, upload, download, release)."
    );
}
