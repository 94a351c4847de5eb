//! The `replay` operation: one recorded analysis session (a trace sequence in the training
//! format, `{"name", "cells": [...]}`) run cell by cell in a new session that works in the
//! traces' data directory, then closed. A cell that fails is not an engine error (recorded
//! notebooks have failing cells); a crash, a timeout or a transport error is.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ops::{status_kind, OpContext, OpOutcome, OpSpec};
use crate::ExecutionStatus;

/// One recorded session.
#[derive(Debug, Deserialize)]
struct Sequence {
    cells: Vec<String>,
}

/// The sequence files of `dir` (`*.json`), sorted.
pub fn load(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|err| format!("{}: {err}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    Ok(files)
}

/// Runs one sequence of `op`, drawn at random.
pub async fn run_one(cx: &OpContext<'_>, op: &OpSpec) -> OpOutcome {
    let (Some(sequences), Some(data)) = (&op.sequences, &op.data) else {
        return OpOutcome::failed("replay without sequences or data");
    };
    let files = match load(&cx.scenario.resolve(sequences)) {
        Ok(files) if !files.is_empty() => files,
        Ok(_) => return OpOutcome::failed("no sequences"),
        Err(err) => return OpOutcome::failed(err),
    };
    let file = &files[fastrand::usize(..files.len())];
    let sequence: Sequence = match std::fs::read_to_string(file)
        .map_err(|err| err.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|err| err.to_string()))
    {
        Ok(sequence) => sequence,
        Err(err) => return OpOutcome::failed(format!("read {}: {err}", file.display())),
    };
    let dir = cx.scenario.resolve(data);
    let dir = dir.canonicalize().unwrap_or(dir);
    let session = match cx.target.create(None, Some(&dir)).await {
        Ok(session) => session,
        Err(kind) => return OpOutcome::failed(format!("create: {kind}")),
    };
    let mut outcome = OpOutcome::default();
    for cell in &sequence.cells {
        match cx
            .target
            .execute(&session, cell, cx.scenario.timeout())
            .await
        {
            Ok(result) if matches!(result.status, ExecutionStatus::Ok | ExecutionStatus::Error) => {
            }
            Ok(result) => {
                outcome.error = Some(status_kind(&result));
                break;
            }
            Err(kind) => {
                outcome.error = Some(kind);
                break;
            }
        }
    }
    if let Err(kind) = cx.target.close(&session).await {
        outcome.error.get_or_insert(format!("close: {kind}"));
    }
    outcome
}
