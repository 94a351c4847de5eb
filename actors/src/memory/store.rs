//! Where outcomes persist: the [`OutcomeStore`] trait and [`SqliteStore`], an embedded
//! SQLite file in the state directory (WAL mode, schema migrations versioned in code,
//! retention pruned oldest first). A store several engines share (the cluster's PostgreSQL,
//! in the engine crate) also gives each engine its own range of ids and tells what the
//! others wrote ([`OutcomeStore::changes`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OptionalExtension};
use serde::{Deserialize, Serialize};

/// The client's description of an execution (`session.execute` param `meta`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionMeta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approach: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

/// One stored execution outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct OutcomeRecord {
    pub id: i64,
    pub owner: String,
    pub session_id: String,
    pub execution_id: String,
    pub at_ms: i64,
    pub code: String,
    pub status: String,
    pub error_type: Option<String>,
    pub error_message: Option<String>,
    pub normalized_message: Option<String>,
    pub duration_ms: f64,
    pub reads: Vec<String>,
    pub meta: Option<ExecutionMeta>,
    /// The line of the code that raised, for a failure.
    pub failing_line: Option<u32>,
    /// The quantised vector (of the failing statement for a failure, else of the code) and
    /// the embedder that made it.
    pub vector: Vec<i8>,
    pub embedder: String,
}

/// A failure pattern and the feedback it got.
#[derive(Debug, Clone, PartialEq)]
pub struct PatternRecord {
    pub id: u32,
    pub owner: String,
    pub error_type: String,
    pub normalized_message: String,
    pub shape: String,
    pub wrong: u32,
    pub right: u32,
    pub fired: u64,
}

/// An insight that was shown: an interruption of the caller.
#[derive(Debug, Clone, PartialEq)]
pub struct InterruptionRecord {
    pub id: i64,
    pub owner: String,
    pub session_id: String,
    pub execution_id: String,
    pub pattern: u32,
    pub confidence: f64,
    pub message: String,
    pub suggestion: Option<String>,
    pub at_ms: i64,
}

/// Feedback on an insight or an outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackRecord {
    pub owner: String,
    pub insight: Option<i64>,
    pub outcome: Option<i64>,
    pub pattern: Option<u32>,
    pub score: i8,
    pub comment: Option<String>,
    pub at_ms: i64,
}

/// One change to the store.
#[derive(Debug, Clone)]
pub enum Write {
    Outcome(Box<OutcomeRecord>),
    /// The names an outcome read, once the worker reported them.
    Reads {
        id: i64,
        reads: Vec<String>,
    },
    /// Inserts or replaces a pattern.
    Pattern(PatternRecord),
    Interruption(InterruptionRecord),
    /// What the caller's next execution did after an interruption.
    NextStatus {
        interruption: i64,
        status: String,
    },
    Feedback(FeedbackRecord),
    /// Keep at most `max` outcomes, none older than `before_ms`.
    Prune {
        max: u64,
        before_ms: Option<i64>,
    },
}

/// Everything a memory starts from.
#[derive(Debug, Default)]
pub struct Loaded {
    pub outcomes: Vec<OutcomeRecord>,
    pub patterns: Vec<PatternRecord>,
    /// Every interruption shown: id, owner and pattern (feedback may come after a restart).
    pub interruptions: Vec<(i64, String, u32)>,
    /// Where [`OutcomeStore::changes`] goes on from, for a shared store.
    pub mark: i64,
}

/// What the other engines sharing a store wrote after a mark.
#[derive(Debug, Default)]
pub struct Changes {
    /// Their new outcomes, oldest first.
    pub outcomes: Vec<OutcomeRecord>,
    /// Patterns whose feedback or firings changed, with the counts of every engine. A pattern
    /// is known by its owner, error type, normalized message and shape: `id` means nothing
    /// here (each engine numbers its patterns itself).
    pub patterns: Vec<PatternRecord>,
    /// Insights they showed: the id and the pattern (by its key, as in `patterns`).
    pub interruptions: Vec<(i64, PatternRecord)>,
    /// Where the next call goes on from.
    pub mark: i64,
}

/// Why the store failed, in the words of the warning that says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("memory store {path}: {kind}: {detail}")]
pub struct StoreError {
    pub path: String,
    pub kind: StoreFailure,
    pub detail: String,
}

/// The kinds of store failure that memory degrades on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StoreFailure {
    #[error("disk full")]
    Full,
    #[error("locked by another process")]
    Locked,
    #[error("read-only")]
    ReadOnly,
    #[error("corrupted")]
    Corrupt,
    #[error("unusable")]
    Other,
}

/// A persistent home for outcomes.
pub trait OutcomeStore: Send {
    /// The newest `max` outcomes no older than `since_ms`, oldest first, and the rest.
    fn load(&mut self, max: u64, since_ms: Option<i64>) -> Result<Loaded, StoreError>;
    /// Applies `writes` together.
    fn apply(&mut self, writes: &[Write]) -> Result<(), StoreError>;
    /// The outcomes with these ids (those still stored).
    fn fetch(&mut self, ids: &[i64]) -> Result<Vec<OutcomeRecord>, StoreError>;
    /// Where the store is, for `memory.stats`.
    fn location(&self) -> String;
    /// For a store that several engines share, the first id of a range that is this
    /// engine's alone, for its outcomes and interruptions. `None` for a store of one engine:
    /// its ids go on from the largest it loaded.
    fn id_base(&mut self) -> Result<Option<i64>, StoreError> {
        Ok(None)
    }
    /// What the other engines sharing the store wrote after `mark` (of [`Loaded`] or of the
    /// last call); `None` for a store of one engine, which nobody else writes.
    fn changes(&mut self, _mark: i64) -> Result<Option<Changes>, StoreError> {
        Ok(None)
    }
}

/// Schema migrations, applied in order; `PRAGMA user_version` says how many ran.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE outcomes (
        id INTEGER PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT NOT NULL,
        execution_id TEXT NOT NULL, at_ms INTEGER NOT NULL, code TEXT NOT NULL,
        status TEXT NOT NULL, error_type TEXT, error_message TEXT, normalized_message TEXT,
        duration_ms REAL NOT NULL, reads TEXT NOT NULL, meta TEXT,
        vector BLOB NOT NULL, embedder TEXT NOT NULL);
     CREATE INDEX outcomes_at ON outcomes(at_ms);
     CREATE TABLE patterns (
        id INTEGER PRIMARY KEY, owner TEXT NOT NULL, error_type TEXT NOT NULL,
        normalized_message TEXT NOT NULL, shape TEXT NOT NULL,
        wrong INTEGER NOT NULL, right INTEGER NOT NULL, fired INTEGER NOT NULL);
     CREATE TABLE interruptions (
        id INTEGER PRIMARY KEY, owner TEXT NOT NULL, session_id TEXT NOT NULL,
        execution_id TEXT NOT NULL, pattern INTEGER NOT NULL, confidence REAL NOT NULL,
        message TEXT NOT NULL, suggestion TEXT, at_ms INTEGER NOT NULL, next_status TEXT);
     CREATE TABLE feedback (
        id INTEGER PRIMARY KEY, owner TEXT NOT NULL, insight INTEGER, outcome INTEGER,
        pattern INTEGER, score INTEGER NOT NULL, comment TEXT, at_ms INTEGER NOT NULL);",
    "ALTER TABLE outcomes ADD COLUMN failing_line INTEGER;",
];

/// Outcomes in an SQLite file.
pub struct SqliteStore {
    path: PathBuf,
    connection: Connection,
}

impl SqliteStore {
    /// Opens (creating and migrating) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let fail = |err: rusqlite::Error| classify(path, &err);
        let connection = Connection::open(path).map_err(fail)?;
        connection
            .busy_timeout(Duration::from_millis(250))
            .map_err(fail)?;
        let mode: String = connection
            .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(fail)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::debug!(path = %path.display(), %mode, "memory store not in WAL mode");
        }
        connection
            .execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(fail)?;
        let mut store = Self {
            path: path.to_owned(),
            connection,
        };
        store.migrate()?;
        Ok(store)
    }

    fn fail(&self, err: rusqlite::Error) -> StoreError {
        classify(&self.path, &err)
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let version: usize = self
            .connection
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(|e| self.fail(e))?;
        if version > MIGRATIONS.len() {
            return Err(StoreError {
                path: self.path.display().to_string(),
                kind: StoreFailure::Other,
                detail: format!("schema version {version} is newer than this engine's"),
            });
        }
        for (done, migration) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = self
                .connection
                .transaction()
                .map_err(|e| classify(&self.path, &e))?;
            tx.execute_batch(migration)
                .and_then(|()| tx.pragma_update(None, "user_version", done + 1))
                .and_then(|()| tx.commit())
                .map_err(|e| classify(&self.path, &e))?;
        }
        Ok(())
    }
}

impl OutcomeStore for SqliteStore {
    fn load(&mut self, max: u64, since_ms: Option<i64>) -> Result<Loaded, StoreError> {
        let path = self.path.clone();
        let fail = |e: rusqlite::Error| classify(&path, &e);
        let mut outcomes = {
            let mut statement = self
                .connection
                .prepare(&format!(
                    "{OUTCOME_COLUMNS} WHERE at_ms >= ?1 ORDER BY id DESC LIMIT ?2"
                ))
                .map_err(fail)?;
            let rows = statement
                .query_map(
                    params![
                        since_ms.unwrap_or(i64::MIN),
                        max.min(i64::MAX as u64) as i64
                    ],
                    outcome_from_row,
                )
                .map_err(fail)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(fail)?
        };
        outcomes.reverse();
        let patterns = {
            let mut statement = self
                .connection
                .prepare(
                    "SELECT id, owner, error_type, normalized_message, shape, wrong, right, fired
                     FROM patterns ORDER BY id",
                )
                .map_err(fail)?;
            let rows = statement
                .query_map([], |row| {
                    Ok(PatternRecord {
                        id: row.get(0)?,
                        owner: row.get(1)?,
                        error_type: row.get(2)?,
                        normalized_message: row.get(3)?,
                        shape: row.get(4)?,
                        wrong: row.get(5)?,
                        right: row.get(6)?,
                        fired: row.get::<_, i64>(7)? as u64,
                    })
                })
                .map_err(fail)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(fail)?
        };
        let interruptions = {
            let mut statement = self
                .connection
                .prepare("SELECT id, owner, pattern FROM interruptions ORDER BY id")
                .map_err(fail)?;
            let rows = statement
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                .map_err(fail)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(fail)?
        };
        Ok(Loaded {
            outcomes,
            patterns,
            interruptions,
            mark: 0,
        })
    }

    fn apply(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let path = self.path.clone();
        let fail = |e: rusqlite::Error| classify(&path, &e);
        let tx = self.connection.transaction().map_err(fail)?;
        for write in writes {
            apply_one(&tx, write).map_err(fail)?;
        }
        tx.commit().map_err(fail)
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    fn fetch(&mut self, ids: &[i64]) -> Result<Vec<OutcomeRecord>, StoreError> {
        let path = self.path.clone();
        let fail = |e: rusqlite::Error| classify(&path, &e);
        let mut statement = self
            .connection
            .prepare_cached(&format!("{OUTCOME_COLUMNS} WHERE id = ?1"))
            .map_err(fail)?;
        let mut found = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(outcome) = statement
                .query_row([id], outcome_from_row)
                .optional()
                .map_err(fail)?
            {
                found.push(outcome);
            }
        }
        Ok(found)
    }
}

const OUTCOME_COLUMNS: &str = "SELECT id, owner, session_id, execution_id, at_ms, code, status,
    error_type, error_message, normalized_message, duration_ms, reads, meta, vector, embedder,
    failing_line FROM outcomes";

fn outcome_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<OutcomeRecord> {
    let reads: String = row.get(11)?;
    let meta: Option<String> = row.get(12)?;
    let vector: Vec<u8> = row.get(13)?;
    Ok(OutcomeRecord {
        id: row.get(0)?,
        owner: row.get(1)?,
        session_id: row.get(2)?,
        execution_id: row.get(3)?,
        at_ms: row.get(4)?,
        code: row.get(5)?,
        status: row.get(6)?,
        error_type: row.get(7)?,
        error_message: row.get(8)?,
        normalized_message: row.get(9)?,
        duration_ms: row.get(10)?,
        reads: serde_json::from_str(&reads).unwrap_or_default(),
        meta: meta.and_then(|meta| serde_json::from_str(&meta).ok()),
        vector: vector.into_iter().map(|b| b as i8).collect(),
        embedder: row.get(14)?,
        failing_line: row.get(15)?,
    })
}

fn apply_one(tx: &rusqlite::Transaction<'_>, write: &Write) -> rusqlite::Result<()> {
    match write {
        Write::Outcome(o) => {
            let reads = serde_json::to_string(&o.reads).unwrap_or_else(|_| "[]".into());
            let meta = o.meta.as_ref().and_then(|m| serde_json::to_string(m).ok());
            let vector: Vec<u8> = o.vector.iter().map(|b| *b as u8).collect();
            tx.prepare_cached(
                "INSERT OR REPLACE INTO outcomes VALUES
                 (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?
            .execute(params![
                o.id,
                o.owner,
                o.session_id,
                o.execution_id,
                o.at_ms,
                o.code,
                o.status,
                o.error_type,
                o.error_message,
                o.normalized_message,
                o.duration_ms,
                reads,
                meta,
                vector,
                o.embedder,
                o.failing_line
            ])?;
        }
        Write::Reads { id, reads } => {
            let reads = serde_json::to_string(reads).unwrap_or_else(|_| "[]".into());
            tx.prepare_cached("UPDATE outcomes SET reads = ?2 WHERE id = ?1")?
                .execute(params![id, reads])?;
        }
        Write::Pattern(p) => {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO patterns VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                p.id,
                p.owner,
                p.error_type,
                p.normalized_message,
                p.shape,
                p.wrong,
                p.right,
                p.fired as i64
            ])?;
        }
        Write::Interruption(i) => {
            tx.prepare_cached(
                "INSERT INTO interruptions VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULL)",
            )?
            .execute(params![
                i.id,
                i.owner,
                i.session_id,
                i.execution_id,
                i.pattern,
                i.confidence,
                i.message,
                i.suggestion,
                i.at_ms
            ])?;
        }
        Write::NextStatus {
            interruption,
            status,
        } => {
            tx.prepare_cached("UPDATE interruptions SET next_status = ?2 WHERE id = ?1")?
                .execute(params![interruption, status])?;
        }
        Write::Feedback(f) => {
            tx.prepare_cached(
                "INSERT INTO feedback (owner, insight, outcome, pattern, score, comment, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                f.owner, f.insight, f.outcome, f.pattern, f.score, f.comment, f.at_ms
            ])?;
        }
        Write::Prune { max, before_ms } => {
            if let Some(before) = before_ms {
                tx.prepare_cached("DELETE FROM outcomes WHERE at_ms < ?1")?
                    .execute([before])?;
            }
            tx.prepare_cached(
                "DELETE FROM outcomes WHERE id <= (SELECT id FROM outcomes ORDER BY id DESC
                 LIMIT 1 OFFSET ?1)",
            )?
            .execute([(*max).min(i64::MAX as u64) as i64])?;
        }
    }
    Ok(())
}

/// Whether the file system holding `path` (its target, if a link) has no space left.
fn no_space_left(path: &Path) -> bool {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    let dir = real.parent().unwrap_or(&real);
    nix::sys::statvfs::statvfs(dir).is_ok_and(|stats| stats.blocks_available() == 0)
}

/// The store failure `err` means.
fn classify(path: &Path, err: &rusqlite::Error) -> StoreError {
    let kind = match err.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => StoreFailure::Full,
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreFailure::Locked,
        Some(ErrorCode::ReadOnly | ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
            StoreFailure::ReadOnly
        }
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreFailure::Corrupt,
        // A write that failed for want of space can come back as an I/O error (the WAL's
        // shared memory, for one): the file system says whether it is full.
        Some(ErrorCode::SystemIoFailure) if no_space_left(path) => StoreFailure::Full,
        _ => StoreFailure::Other,
    };
    StoreError {
        path: path.display().to_string(),
        kind,
        detail: err.to_string(),
    }
}
