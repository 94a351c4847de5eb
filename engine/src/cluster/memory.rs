//! The memory feature's store on the cluster's PostgreSQL: [`SharedOutcomes`], the
//! [`OutcomeStore`] the nodes of a cluster share, so that an insight learnt on one node warns
//! on every node (still per owner). Schema: migration 3 ([`super::migrations`]).
//!
//! The memory calls it from threads of its own (the writer, a reader for `memory.search`,
//! the follower), never on an execution's path: each instance has its own small tokio
//! runtime and a connection pool of its own on it.
//!
//! - Ids: each engine takes a block of ids at start ([`OutcomeStore::id_base`]), so two nodes
//!   never give one outcome or insight id.
//! - Order: every write takes the next `seq` under an advisory lock held to its commit, so a
//!   row with a larger `seq` is never visible before one with a smaller; a node follows the
//!   others by asking for what is past the last `seq` it saw ([`OutcomeStore::changes`]).
//! - Patterns are known by their key (owner, error type, normalized message, shape): each
//!   engine numbers its patterns itself, and this store maps the numbers of the engine it
//!   writes for to keys. Feedback and insights shown count up the pattern's row, so the
//!   counts of every node add up, and a pattern silenced on one node is silenced on all.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use deadpool_postgres::Transaction;
use pyvisor_actors::memory::{
    Changes, ExecutionMeta, Loaded, OutcomeRecord, OutcomeStore, PatternRecord, StoreError,
    StoreFailure, Write,
};
use tokio_postgres::Row;

use super::config::ClusterConfig;
use super::store::Store;
use crate::config::SharedMemoryStore;

/// The advisory lock that orders the memory's writes: "pyvmem" in ASCII.
const WRITE_LOCK: i64 = 0x7079_766d_656d;

/// Bits of an id within an engine's block.
const BLOCK_BITS: u32 = 32;

/// What [`SharedOutcomes::location`] says, and errors name.
const LOCATION: &str = "postgresql (the cluster store)";

const OUTCOME_COLUMNS: &str = "SELECT id, owner, session_id, execution_id, at_ms, code, status,
    error_type, error_message, normalized_message, duration_ms, reads, meta, vector, embedder,
    failing_line FROM pyvisor_memory_outcomes";

/// A pattern's key.
type Key = (String, String, String, String);

/// The memory's outcomes in the cluster's PostgreSQL, as one engine writes and reads them.
pub struct SharedOutcomes {
    /// Dropped in the background: the memory may let go of its reader on a runtime's thread.
    runtime: Option<tokio::runtime::Runtime>,
    store: Store,
    node_id: String,
    /// The keys of the patterns of the engine this store writes for, by its numbers.
    patterns: HashMap<u32, Key>,
}

/// How the engine of the node `cluster` configures opens its memory's stores.
pub fn opener(cluster: &ClusterConfig) -> SharedMemoryStore {
    let (config, node_id) = (cluster.store.clone(), cluster.node_id.clone());
    SharedMemoryStore(Arc::new(move || {
        SharedOutcomes::open(&config, &node_id)
            .map(|store| Box::new(store) as Box<dyn OutcomeStore>)
    }))
}

impl Drop for SharedOutcomes {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn failed(detail: impl std::fmt::Display) -> StoreError {
    StoreError {
        path: LOCATION.to_owned(),
        kind: StoreFailure::Other,
        detail: detail.to_string(),
    }
}

impl SharedOutcomes {
    /// Connects, as node `node_id`, to the store at `config` (migrating its schema).
    /// Blocking: never call it on a runtime's thread.
    pub fn open(config: &tokio_postgres::Config, node_id: &str) -> Result<Self, StoreError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("pyvisor-memory-store")
            .build()
            .map_err(failed)?;
        let store = runtime.block_on(Store::open(config)).map_err(failed)?;
        Ok(Self {
            runtime: Some(runtime),
            store,
            node_id: node_id.to_owned(),
            patterns: HashMap::new(),
        })
    }

    fn block_on<T>(&self, work: impl Future<Output = T>) -> T {
        self.runtime
            .as_ref()
            .expect("the runtime lives until the store is dropped")
            .block_on(work)
    }

    /// Runs `work` in a transaction (read-only and on one snapshot when `snapshot`).
    fn transaction<T>(
        &self,
        snapshot: bool,
        work: impl for<'t> AsyncFnOnce(&'t Transaction<'t>) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, StoreError> {
        self.block_on(async {
            let mut client = self.store.client().await.map_err(failed)?;
            let mut builder = client.build_transaction();
            if snapshot {
                builder = builder
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true);
            }
            let tx = builder.start().await.map_err(failed)?;
            let done = work(&tx).await.map_err(failed)?;
            tx.commit().await.map_err(failed)?;
            Ok(done)
        })
    }
}

impl OutcomeStore for SharedOutcomes {
    fn load(&mut self, max: u64, since_ms: Option<i64>) -> Result<Loaded, StoreError> {
        let limit = max.min(i64::MAX as u64) as i64;
        let since = since_ms.unwrap_or(i64::MIN);
        let (outcomes, patterns, shown, mark) = self.transaction(true, async |tx| {
            let sql = format!(
                "{OUTCOME_COLUMNS} WHERE at_ms >= $1 ORDER BY at_ms DESC, id DESC LIMIT $2"
            );
            let outcomes = tx.query(&sql, &[&since, &limit]).await?;
            let patterns = tx
                .query(
                    "SELECT owner, error_type, normalized_message, shape, wrong, helpful, fired
                     FROM pyvisor_memory_patterns ORDER BY seq",
                    &[],
                )
                .await?;
            let shown = tx
                .query(
                    "SELECT id, owner, error_type, normalized_message, shape
                     FROM pyvisor_memory_interruptions ORDER BY id",
                    &[],
                )
                .await?;
            let mark: i64 = tx
                .query_one(
                    "SELECT greatest(
                         (SELECT max(seq) FROM pyvisor_memory_outcomes),
                         (SELECT max(seq) FROM pyvisor_memory_patterns),
                         (SELECT max(seq) FROM pyvisor_memory_interruptions), 0)",
                    &[],
                )
                .await?
                .get(0);
            Ok((outcomes, patterns, shown, mark))
        })?;
        let mut loaded = Loaded {
            outcomes: outcomes.iter().rev().map(outcome_from_row).collect(),
            mark,
            ..Loaded::default()
        };
        // The engine numbers patterns from 0 in the order it loads them.
        let mut numbers: HashMap<Key, u32> = HashMap::new();
        for row in &patterns {
            let mut pattern = pattern_from_row(row);
            pattern.id = loaded.patterns.len() as u32;
            numbers.insert(key_of(&pattern), pattern.id);
            loaded.patterns.push(pattern);
        }
        for row in &shown {
            let key: Key = (row.get(1), row.get(2), row.get(3), row.get(4));
            if let Some(&number) = numbers.get(&key) {
                loaded.interruptions.push((row.get(0), key.0, number));
            }
        }
        self.patterns = numbers.into_iter().map(|(key, id)| (id, key)).collect();
        Ok(loaded)
    }

    fn apply(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        // New patterns first: a feedback of the same batch counts against them.
        for write in writes {
            if let Write::Pattern(pattern) = write {
                self.patterns.insert(pattern.id, key_of(pattern));
            }
        }
        let patterns = &self.patterns;
        let node_id = self.node_id.as_str();
        self.transaction(false, async |tx| {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])
                .await?;
            for write in writes {
                apply_one(tx, node_id, patterns, write).await?;
            }
            Ok(())
        })
    }

    fn fetch(&mut self, ids: &[i64]) -> Result<Vec<OutcomeRecord>, StoreError> {
        let rows = self.transaction(true, async |tx| {
            let sql = format!("{OUTCOME_COLUMNS} WHERE id = ANY($1)");
            tx.query(&sql, &[&ids]).await
        })?;
        Ok(rows.iter().map(outcome_from_row).collect())
    }

    fn location(&self) -> String {
        LOCATION.to_owned()
    }

    fn id_base(&mut self) -> Result<Option<i64>, StoreError> {
        let block: i64 = self.transaction(false, async |tx| {
            let row = tx
                .query_one("SELECT nextval('pyvisor_memory_id_blocks')", &[])
                .await?;
            Ok(row.get(0))
        })?;
        Ok(Some(block << BLOCK_BITS))
    }

    fn changes(&mut self, mark: i64) -> Result<Option<Changes>, StoreError> {
        let node_id = self.node_id.as_str();
        let (outcomes, patterns, shown, next) = self.transaction(true, async |tx| {
            let sql = format!("{OUTCOME_COLUMNS} WHERE seq > $1 AND node_id <> $2 ORDER BY seq");
            let outcomes = tx.query(&sql, &[&mark, &node_id]).await?;
            let patterns = tx
                .query(
                    "SELECT owner, error_type, normalized_message, shape, wrong, helpful, fired
                     FROM pyvisor_memory_patterns WHERE seq > $1 ORDER BY seq",
                    &[&mark],
                )
                .await?;
            let shown = tx
                .query(
                    "SELECT id, owner, error_type, normalized_message, shape
                     FROM pyvisor_memory_interruptions
                     WHERE seq > $1 AND node_id <> $2 ORDER BY seq",
                    &[&mark, &node_id],
                )
                .await?;
            // Past this node's own rows too, so they are not read again at every call.
            let next: i64 = tx
                .query_one(
                    "SELECT greatest(
                         (SELECT max(seq) FROM pyvisor_memory_outcomes WHERE seq > $1),
                         (SELECT max(seq) FROM pyvisor_memory_patterns WHERE seq > $1),
                         (SELECT max(seq) FROM pyvisor_memory_interruptions WHERE seq > $1),
                         $1)",
                    &[&mark],
                )
                .await?
                .get(0);
            Ok((outcomes, patterns, shown, next))
        })?;
        Ok(Some(Changes {
            outcomes: outcomes.iter().map(outcome_from_row).collect(),
            patterns: patterns.iter().map(pattern_from_row).collect(),
            interruptions: shown
                .iter()
                .map(|row| {
                    let key = PatternRecord {
                        id: 0,
                        owner: row.get(1),
                        error_type: row.get(2),
                        normalized_message: row.get(3),
                        shape: row.get(4),
                        wrong: 0,
                        right: 0,
                        fired: 0,
                    };
                    (row.get(0), key)
                })
                .collect(),
            mark: next,
        }))
    }
}

fn key_of(pattern: &PatternRecord) -> Key {
    (
        pattern.owner.clone(),
        pattern.error_type.clone(),
        pattern.normalized_message.clone(),
        pattern.shape.clone(),
    )
}

/// A pattern from a row of `owner, error_type, normalized_message, shape, wrong, helpful,
/// fired`, numbered 0 (the engine numbers it).
fn pattern_from_row(row: &Row) -> PatternRecord {
    let count = |column: usize| row.get::<_, i64>(column).max(0);
    PatternRecord {
        id: 0,
        owner: row.get(0),
        error_type: row.get(1),
        normalized_message: row.get(2),
        shape: row.get(3),
        wrong: count(4).min(u32::MAX as i64) as u32,
        right: count(5).min(u32::MAX as i64) as u32,
        fired: count(6) as u64,
    }
}

fn outcome_from_row(row: &Row) -> OutcomeRecord {
    let reads: String = row.get(11);
    let meta: Option<String> = row.get(12);
    let vector: Vec<u8> = row.get(13);
    OutcomeRecord {
        id: row.get(0),
        owner: row.get(1),
        session_id: row.get(2),
        execution_id: row.get(3),
        at_ms: row.get(4),
        code: row.get(5),
        status: row.get(6),
        error_type: row.get(7),
        error_message: row.get(8),
        normalized_message: row.get(9),
        duration_ms: row.get(10),
        reads: serde_json::from_str(&reads).unwrap_or_default(),
        meta: meta.and_then(|meta| serde_json::from_str::<ExecutionMeta>(&meta).ok()),
        vector: vector.into_iter().map(|b| b as i8).collect(),
        embedder: row.get(14),
        failing_line: row
            .get::<_, Option<i32>>(15)
            .and_then(|line| u32::try_from(line).ok()),
    }
}

async fn apply_one(
    tx: &Transaction<'_>,
    node_id: &str,
    patterns: &HashMap<u32, Key>,
    write: &Write,
) -> Result<(), tokio_postgres::Error> {
    match write {
        Write::Outcome(o) => {
            let reads = serde_json::to_string(&o.reads).unwrap_or_else(|_| "[]".into());
            let meta = o.meta.as_ref().and_then(|m| serde_json::to_string(m).ok());
            let vector: Vec<u8> = o.vector.iter().map(|b| *b as u8).collect();
            let failing_line = o.failing_line.and_then(|line| i32::try_from(line).ok());
            let statement = tx
                .prepare_cached(
                    "INSERT INTO pyvisor_memory_outcomes VALUES ($1, nextval('pyvisor_memory_seq'),
                     $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
                     ON CONFLICT (id) DO NOTHING",
                )
                .await?;
            tx.execute(
                &statement,
                &[
                    &o.id,
                    &node_id,
                    &o.owner,
                    &o.session_id,
                    &o.execution_id,
                    &o.at_ms,
                    &o.code,
                    &o.status,
                    &o.error_type,
                    &o.error_message,
                    &o.normalized_message,
                    &o.duration_ms,
                    &reads,
                    &meta,
                    &failing_line,
                    &vector,
                    &o.embedder,
                ],
            )
            .await?;
        }
        Write::Reads { id, reads } => {
            let reads = serde_json::to_string(reads).unwrap_or_else(|_| "[]".into());
            tx.execute(
                "UPDATE pyvisor_memory_outcomes SET reads = $2 WHERE id = $1",
                &[id, &reads],
            )
            .await?;
        }
        Write::Pattern(p) => {
            // Its counts change only by the feedback and insights that come as writes of
            // their own, so that those of every node add up.
            let statement = tx
                .prepare_cached(
                    "INSERT INTO pyvisor_memory_patterns
                         (owner, error_type, normalized_message, shape, seq)
                     VALUES ($1, $2, $3, $4, nextval('pyvisor_memory_seq'))
                     ON CONFLICT DO NOTHING",
                )
                .await?;
            tx.execute(
                &statement,
                &[&p.owner, &p.error_type, &p.normalized_message, &p.shape],
            )
            .await?;
        }
        Write::Interruption(i) => {
            let Some(key) = patterns.get(&i.pattern) else {
                tracing::debug!(
                    pattern = i.pattern,
                    "an insight of an unknown pattern is not stored"
                );
                return Ok(());
            };
            count_up(tx, key, "fired").await?;
            let statement = tx
                .prepare_cached(
                    "INSERT INTO pyvisor_memory_interruptions VALUES ($1,
                     nextval('pyvisor_memory_seq'), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11,
                     $12, NULL) ON CONFLICT (id) DO NOTHING",
                )
                .await?;
            tx.execute(
                &statement,
                &[
                    &i.id,
                    &node_id,
                    &i.owner,
                    &i.session_id,
                    &i.execution_id,
                    &key.1,
                    &key.2,
                    &key.3,
                    &i.confidence,
                    &i.message,
                    &i.suggestion,
                    &i.at_ms,
                ],
            )
            .await?;
        }
        Write::NextStatus {
            interruption,
            status,
        } => {
            tx.execute(
                "UPDATE pyvisor_memory_interruptions SET next_status = $2 WHERE id = $1",
                &[interruption, status],
            )
            .await?;
        }
        Write::Feedback(f) => {
            let key = f.pattern.and_then(|pattern| patterns.get(&pattern));
            match (key, f.score) {
                (Some(key), -1) => count_up(tx, key, "wrong").await?,
                (Some(key), 1) => count_up(tx, key, "helpful").await?,
                _ => {}
            }
            let statement = tx
                .prepare_cached(
                    "INSERT INTO pyvisor_memory_feedback (node_id, owner, insight, outcome,
                         error_type, normalized_message, shape, score, comment, at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .await?;
            tx.execute(
                &statement,
                &[
                    &node_id,
                    &f.owner,
                    &f.insight,
                    &f.outcome,
                    &key.map(|k| &k.1),
                    &key.map(|k| &k.2),
                    &key.map(|k| &k.3),
                    &i16::from(f.score),
                    &f.comment,
                    &f.at_ms,
                ],
            )
            .await?;
        }
        Write::Prune { max, before_ms } => {
            if let Some(before) = before_ms {
                tx.execute(
                    "DELETE FROM pyvisor_memory_outcomes WHERE at_ms < $1",
                    &[before],
                )
                .await?;
            }
            let keep = (*max).min(i64::MAX as u64) as i64;
            tx.execute(
                "DELETE FROM pyvisor_memory_outcomes WHERE id IN (
                     SELECT id FROM pyvisor_memory_outcomes
                     ORDER BY at_ms DESC, id DESC OFFSET $1)",
                &[&keep],
            )
            .await?;
        }
    }
    Ok(())
}

/// Adds one to `column` of the pattern `key` (a column name of this module's, never input).
async fn count_up(
    tx: &Transaction<'_>,
    key: &Key,
    column: &'static str,
) -> Result<(), tokio_postgres::Error> {
    let sql = format!(
        "UPDATE pyvisor_memory_patterns
             SET {column} = {column} + 1, seq = nextval('pyvisor_memory_seq')
         WHERE owner = $1 AND error_type = $2 AND normalized_message = $3 AND shape = $4"
    );
    let statement = tx.prepare_cached(&sql).await?;
    tx.execute(&statement, &[&key.0, &key.1, &key.2, &key.3])
        .await?;
    Ok(())
}
