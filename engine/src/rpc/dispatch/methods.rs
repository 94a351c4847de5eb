//! The session methods of docs/protocol.md (`session.create` … `session.hint`, `engine.stats`,
//! `engine.health`): each turns its decoded params into an engine call and the answer into
//! its wire result. [`super::Dispatcher::call`] routes to them.

use std::path::PathBuf;

use futures::StreamExt;

use super::report::session_info;
use super::{Dispatcher, Scope};
use crate::errors::ClusterError;
use crate::rpc::errors::RpcError;
use crate::rpc::outbound::Outbound;
use crate::rpc::params::check_name;
use crate::rpc::wire::{self, notification};
use crate::{EngineError, ExecuteRequest, ExecutionEvent, SessionOptions};

impl Dispatcher {
    pub(super) async fn create(
        &self,
        at: &Scope<'_>,
        params: wire::CreateParams,
    ) -> Result<wire::Created, RpcError> {
        at.unpinned()?;
        self.refuse_when_draining()?;
        if let Some(name) = &params.name {
            check_name(name)?;
            if let Some(existing) = self.named_in_cluster(at.owner(), name).await? {
                return self.attach_in_cluster(at, existing).await;
            }
        }
        let python = match params.python.as_deref() {
            Some(python) => Some(
                self.engine
                    .interpreter(python)
                    .await
                    .map_err(|err| RpcError::invalid_params(format!("python: {err}")))?,
            ),
            None => None,
        };
        if let Some(cwd) = &params.cwd {
            if !std::path::Path::new(cwd).is_dir() {
                return Err(RpcError::invalid_params(format!(
                    "cwd: {cwd:?} is not a directory"
                )));
            }
        }
        let asked_limits = params.limits.unwrap_or_default();
        let limits = Some(self.limit_policy().session_limits(&asked_limits)?);
        let options = SessionOptions {
            name: params.name,
            owner: at.owner.clone(),
            python,
            cwd: params.cwd.map(PathBuf::from),
            env: params.env.unwrap_or_default().into_iter().collect(),
            limits,
            proactive: params.proactive,
            network: params.network,
            llm: match params.llm {
                Some(wire::LlmChoice::Engine(on)) => Some(on),
                Some(wire::LlmChoice::Client) | None => None,
            },
            llm_by_client: params.llm == Some(wire::LlmChoice::Client),
            bridge: None,
            take_over: None,
        };
        let session = self.engine.create_session(options).await?;
        match self.register(&session, Some(&asked_limits)).await {
            Ok(()) => {}
            // Another node registered the name first: its session is the one.
            Err(ClusterError::NameTaken { session_id, .. }) if !session_id.is_empty() => {
                return self.attach_in_cluster(at, session_id).await
            }
            Err(err) => return Err(err.into()),
        }
        let (pid, python_version) = match session.pid() {
            Some(pid) => (Some(pid), session.python_version().map(str::to_owned)),
            None => {
                // An attach does not carry the worker; ask the session.
                let info = session.info().await?;
                (info.pid, info.python_version)
            }
        };
        let created = wire::Created {
            session_id: session.id().to_owned(),
            pid,
            python_version,
            warm: session.warm(),
            attached: session.attached(),
            restored: session.restored(),
        };
        self.sessions
            .remember(&at.owner, &created.session_id, session);
        Ok(created)
    }

    pub(super) async fn execute(
        &self,
        at: &Scope<'_>,
        params: wire::ExecuteParams,
        out: &Outbound,
    ) -> Result<crate::ExecutionResult, RpcError> {
        let mut request = ExecuteRequest::new(params.code);
        if let Some(timeout_s) = params.timeout_s {
            request.timeout = Some(self.limit_policy().timeout("timeout_s", timeout_s)?);
        }
        if let Some(transaction) = params.transaction {
            request.transaction = transaction;
        }
        request.queue = params.queue.unwrap_or(true);
        request.cache = params.cache.unwrap_or(true);
        request.input = params.stream;
        request.meta = params.meta;
        request.llm = self.client_llm.answerer(out);
        let session = self.session(at, &params.session_id).await?;
        if !params.stream {
            return session.run(request).await.map_err(|err| {
                self.sessions.forget_if_closed(&err);
                RpcError::from(err)
            });
        }
        let mut execution = session.execute(request).await.map_err(|err| {
            self.sessions.forget_if_closed(&err);
            RpcError::from(err)
        })?;
        let echo = params.stream_echo.unwrap_or(true);
        let session_id = session.id().to_owned();
        let execution_id = execution.id().to_owned();
        while let Some(event) = execution.next().await {
            // A closed connection only loses the notifications; the execution goes on.
            match event {
                ExecutionEvent::Output { stream, data } => {
                    let note = wire::OutputNote {
                        session_id: session_id.clone(),
                        execution_id: execution_id.clone(),
                        stream,
                        data,
                    };
                    out.notify(notification::OUTPUT, &note).await;
                }
                ExecutionEvent::InputRequest { prompt, password } => {
                    let note = wire::InputRequestNote {
                        session_id: session_id.clone(),
                        execution_id: execution_id.clone(),
                        prompt,
                        password,
                    };
                    if !out.notify(notification::INPUT_REQUEST, &note).await {
                        // Nobody is left to answer: input() raises EOFError now rather
                        // than after the input timeout.
                        let _ = session.send_input(&execution_id, None).await;
                    }
                }
                ExecutionEvent::Display(display) => {
                    let note = wire::DisplayNote {
                        session_id: session_id.clone(),
                        execution_id: execution_id.clone(),
                        mime: display.mime,
                        data: display.data,
                    };
                    out.notify(notification::DISPLAY, &note).await;
                }
                ExecutionEvent::Finished(mut result) => {
                    if !echo {
                        // The caller has every byte from the notifications already.
                        result.stdout.clear();
                        result.stderr.clear();
                    }
                    return Ok(*result);
                }
            }
        }
        Err(EngineError::Stopped.into())
    }

    pub(super) async fn input(
        &self,
        at: &Scope<'_>,
        params: wire::InputParams,
    ) -> Result<wire::Empty, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        session
            .send_input(&params.execution_id, params.value)
            .await?;
        Ok(wire::Empty {})
    }

    pub(super) async fn interrupt(
        &self,
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<wire::Interrupted, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        let interrupted = session.interrupt().await?;
        Ok(wire::Interrupted { interrupted })
    }

    pub(super) async fn checkpoint(
        &self,
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<wire::CheckpointTaken, RpcError> {
        let summary = self
            .session(at, &params.session_id)
            .await?
            .checkpoint()
            .await?;
        Ok(wire::CheckpointTaken {
            checkpoint_id: summary.checkpoint_id,
            bytes: summary.bytes,
            state_bytes: summary.state_bytes,
            saved: summary.saved,
            lost: summary.lost,
            duration_ms: summary.duration_ms,
        })
    }

    pub(super) async fn restore(
        &self,
        at: &Scope<'_>,
        params: wire::RestoreParams,
    ) -> Result<wire::Restored, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        let summary = session.restore(params.checkpoint_id.as_deref()).await?;
        Ok(wire::Restored {
            checkpoint_id: summary.checkpoint_id,
            restored: summary.restored,
            kept: summary.kept,
            lost: summary.lost,
        })
    }

    pub(super) async fn checkpoints(
        &self,
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<Vec<wire::CheckpointEntry>, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        let checkpoints = session.checkpoints().await?;
        Ok(checkpoints
            .into_iter()
            .map(|info| wire::CheckpointEntry {
                checkpoint_id: info.id.to_string(),
                created_at: wire::unix_seconds(info.created_at),
                bytes: info.file_bytes,
                state_bytes: info.state_bytes,
                execution_count: info.meta.execution_count,
                saved: info.meta.names_saved,
                lost: info.meta.names_lost,
            })
            .collect())
    }

    pub(super) async fn info(
        &self,
        at: &Scope<'_>,
        params: wire::SessionRef,
    ) -> Result<wire::SessionInfo, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        let mut info = session_info(&session).await.map_err(|err| {
            self.sessions.forget_if_closed(&err);
            RpcError::from(err)
        })?;
        info.node = self.node_id();
        Ok(info)
    }

    /// `params.owner` was taken out by [`Dispatcher::call`] into the scope.
    pub(super) async fn list(
        &self,
        at: &Scope<'_>,
        _params: wire::ListParams,
    ) -> Result<Vec<wire::SessionInfo>, RpcError> {
        at.unpinned()?;
        let sessions = self.engine.sessions(at.owner.as_deref()).await?;
        let infos = futures::future::join_all(sessions.iter().map(session_info)).await;
        // A session closed between the listing and its info is no longer in the list.
        let node = self.node_id();
        Ok(infos
            .into_iter()
            .filter_map(Result::ok)
            .map(|info| wire::SessionInfo {
                node: node.clone(),
                ..info
            })
            .collect())
    }

    pub(super) async fn close(
        &self,
        at: &Scope<'_>,
        params: wire::CloseParams,
    ) -> Result<wire::Empty, RpcError> {
        let session = self.session(at, &params.session_id).await?;
        let session_id = session.id().to_owned();
        self.sessions.forget(&session_id);
        if params.checkpoint {
            session.close_with_checkpoint().await?;
        } else {
            session.close().await?;
        }
        self.unregister(&session_id).await?;
        Ok(wire::Empty {})
    }

    pub(super) async fn fork(
        &self,
        at: &Scope<'_>,
        params: wire::ForkParams,
    ) -> Result<wire::ForkResult, RpcError> {
        let names = params.names.unwrap_or_default();
        for name in &names {
            check_name(name)?;
        }
        let count = match (params.count, names.len()) {
            (Some(count), _) => count,
            (None, 0) => 1,
            (None, named) => named,
        };
        let session = self.session(at, &params.session_id).await?;
        let forked = session.fork(count, names).await?;
        // With [cluster], each clone enters the directory like a new session; when one is
        // refused (the owner's quota, a drain), none of them stays.
        for (index, clone) in forked.sessions.iter().enumerate() {
            if let Err(err) = self.register(clone, None).await {
                for (other, done) in forked
                    .sessions
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != index)
                {
                    if other < index {
                        let _ = self.unregister(done.id()).await;
                    }
                    let _ = done.clone().close().await;
                }
                return Err(err.into());
            }
        }
        let sessions = forked
            .sessions
            .into_iter()
            .map(|clone| {
                let entry = wire::ForkedSession {
                    session_id: clone.id().to_owned(),
                    pid: clone.pid(),
                    name: clone.name().map(str::to_owned),
                };
                self.sessions.remember(&at.owner, &entry.session_id, clone);
                entry
            })
            .collect();
        Ok(wire::ForkResult {
            sessions,
            duration_ms: forked.duration.as_secs_f64() * 1000.0,
            threads: forked.threads,
        })
    }

    pub(super) async fn stats(&self) -> Result<wire::Stats, RpcError> {
        let stats = self.engine.stats().await?;
        Ok(wire::Stats {
            pool: stats.pool,
            sessions: stats.sessions,
            executions: stats.executions,
            crashes: stats.crashes,
            restores: stats.restores,
            proactive: stats.proactive,
            memory: self.engine.memory_stats(None),
            llm: stats.llm,
        })
    }

    pub(super) async fn hint(
        &self,
        at: &Scope<'_>,
        params: wire::HintParams,
    ) -> Result<wire::Hinted, RpcError> {
        const MAX_HINTS: usize = 64;
        const MAX_HINT_BYTES: usize = 64 * 1024;
        if params.code.len() > MAX_HINTS {
            return Err(RpcError::invalid_params(format!(
                "code: at most {MAX_HINTS} snippets per hint, got {}",
                params.code.len()
            )));
        }
        if let Some(long) = params.code.iter().find(|code| code.len() > MAX_HINT_BYTES) {
            return Err(RpcError::invalid_params(format!(
                "code: a snippet of {} bytes; a hint takes snippets of at most {MAX_HINT_BYTES}",
                long.len()
            )));
        }
        let session = self.session(at, &params.session_id).await?;
        let accepted = session.hint(params.code).await?;
        Ok(wire::Hinted { accepted })
    }

    pub(super) fn health(&self) -> wire::Health {
        wire::Health {
            status: if self.is_stopping() { "stopping" } else { "ok" }.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_s: self.started.elapsed().as_secs_f64(),
        }
    }
}
