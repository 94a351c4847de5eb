//! What `session.info` and `session.list` report of a session: the engine's snapshot in
//! its wire form.

use pyvisor_actors::session::SessionPhase;

use crate::rpc::wire;
use crate::{EngineError, Session};

/// `session.info` of one session.
pub(super) async fn session_info(session: &Session) -> Result<wire::SessionInfo, EngineError> {
    let snapshot = session.info().await?;
    let (variables, definitions, rss_bytes) = match snapshot.namespace {
        Some(namespace) => (
            namespace
                .variables
                .into_iter()
                .map(|variable| wire::VariableInfo {
                    name: variable.name,
                    type_name: variable.type_name,
                    size_bytes: variable.size_bytes,
                })
                .collect(),
            namespace
                .definitions
                .into_iter()
                .map(|definition| wire::DefinitionInfo {
                    name: definition.name,
                    kind: definition.kind,
                    source: definition.source,
                })
                .collect(),
            namespace.rss_bytes,
        ),
        None => (Vec::new(), Vec::new(), None),
    };
    let limits = &snapshot.limits;
    let limits = wire::LimitsInfo {
        memory_mb: limits.memory_mb,
        cpu_s: limits.cpu_s,
        open_files: limits.open_files,
        processes: limits.processes,
        timeout_s: limits.timeout.as_secs_f64(),
        output_bytes: limits.output_bytes,
        result_repr_bytes: limits.result_repr_bytes,
        input_timeout_s: limits.input_timeout.as_secs_f64(),
        interrupt_grace_s: limits.interrupt_grace.as_secs_f64(),
        file_bytes: limits.file_bytes,
        disk_mb: limits.disk_mb,
    };
    Ok(wire::SessionInfo {
        session_id: snapshot.session_id,
        name: session.name().map(str::to_owned),
        owner: session.owner().map(str::to_owned),
        pid: snapshot.pid,
        state: phase_name(snapshot.phase).into(),
        execution_count: snapshot.execution_count,
        variables,
        rss_bytes,
        created_at: wire::unix_seconds(session.created_at()),
        last_checkpoint: snapshot.last_checkpoint,
        durability: wire::Durability {
            saved: snapshot.durability.saved,
            last_checkpoint: snapshot.durability.last_checkpoint,
            unsaved_executions: snapshot.durability.unsaved_executions,
            lost_names: snapshot.durability.lost_names,
            failure: snapshot.durability.failure,
        },
        cpu_s: snapshot.cpu_s,
        proactive: snapshot.proactive.map(|stats| wire::SessionProactive {
            stats,
            ahead: snapshot.ahead,
            speculating: snapshot.speculating,
        }),
        sandbox: snapshot
            .sandbox
            .map(|applied| wire::SandboxInfo {
                uid: applied.uid,
                landlock: applied.landlock.map(|abi| format!("abi {abi}")),
                seccomp: applied.seccomp,
                network: applied.network,
                clone_isolation: applied.clone_isolation,
            })
            .unwrap_or_default(),
        containment: snapshot.containment.map(str::to_owned),
        definitions,
        limits: Some(limits),
        node: None,
    })
}

/// The `state` of `session.info`.
fn phase_name(phase: SessionPhase) -> &'static str {
    match phase {
        SessionPhase::Idle => "idle",
        SessionPhase::Busy => "busy",
        // Failed: no worker could be had yet; the next execution tries again.
        SessionPhase::Restarting | SessionPhase::Failed => "restarting",
        SessionPhase::Closing => "closing",
        SessionPhase::Closed => "closed",
    }
}
