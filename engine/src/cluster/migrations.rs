//! The shared store's schema, versioned in code.
//!
//! Every node applies the migrations it knows at start, in one transaction that first takes a
//! transaction-scoped advisory lock: two nodes starting together against an empty database
//! apply each migration once, the second waiting for the first and then finding nothing left
//! to do. `pyvisor_schema` records the versions applied. A migration, once released, is never
//! edited: a change of schema is a new version.
//!
//! The fence is in SQL, not only in Rust: a trigger on the checkpoint tables refuses a row
//! whose epoch is not the session's current one (SQLSTATE `PV001`), whatever the writer.

use tokio_postgres::Client;

use crate::errors::ClusterError;

/// The advisory lock key that serialises migrations: "pyvisor" in ASCII.
const MIGRATION_LOCK: i64 = 0x0070_7976_6973_6f72;

/// The SQLSTATE of a write under a stale epoch.
pub const FENCED: &str = "PV001";

/// The migrations, in order; version `n` is `MIGRATIONS[n - 1]`.
const MIGRATIONS: &[&str] = &[
    // 1: nodes, the session directory with leases and epochs, checkpoints in chunks.
    r#"
    CREATE TABLE pyvisor_nodes (
        node_id       text PRIMARY KEY,
        advertise_url text NOT NULL,
        started_at    timestamptz NOT NULL DEFAULT now(),
        heartbeat_at  timestamptz NOT NULL DEFAULT now()
    );

    CREATE TABLE pyvisor_sessions (
        session_id       text PRIMARY KEY,
        name             text,
        owner            text,
        holder           text REFERENCES pyvisor_nodes (node_id),
        lease_expires_at timestamptz NOT NULL,
        epoch            bigint NOT NULL CHECK (epoch > 0),
        execution_count  bigint NOT NULL DEFAULT 0,
        created_at       timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX pyvisor_sessions_holder ON pyvisor_sessions (holder);

    -- The latest checkpoint of each session: its metadata and the worker's index, compressed.
    CREATE TABLE pyvisor_checkpoints (
        session_id      text PRIMARY KEY
                        REFERENCES pyvisor_sessions (session_id) ON DELETE CASCADE,
        checkpoint_id   text NOT NULL,
        epoch           bigint NOT NULL,
        node_id         text NOT NULL,
        execution_count bigint NOT NULL,
        manifest        bytea NOT NULL,
        payload         bytea NOT NULL,
        created_at      timestamptz NOT NULL DEFAULT now()
    );

    -- The blobs of the checkpoints, content-addressed per session, zstd-compressed in chunks.
    CREATE TABLE pyvisor_blob_chunks (
        session_id text NOT NULL
                   REFERENCES pyvisor_sessions (session_id) ON DELETE CASCADE,
        blob       text NOT NULL,
        seq        integer NOT NULL,
        epoch      bigint NOT NULL,
        data       bytea NOT NULL,
        PRIMARY KEY (session_id, blob, seq)
    );

    -- Refuses a checkpoint row written under any epoch but the session's current one. The
    -- share lock on the session's row makes a claim wait for a write in progress, and a
    -- write wait for a claim in progress.
    CREATE FUNCTION pyvisor_fence() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        current_epoch bigint;
    BEGIN
        SELECT epoch INTO current_epoch FROM pyvisor_sessions
            WHERE session_id = NEW.session_id FOR SHARE;
        IF current_epoch IS NULL OR current_epoch <> NEW.epoch THEN
            RAISE EXCEPTION 'session % is held under epoch %, not %',
                NEW.session_id, current_epoch, NEW.epoch
                USING ERRCODE = 'PV001';
        END IF;
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER pyvisor_checkpoints_fence BEFORE INSERT OR UPDATE ON pyvisor_checkpoints
        FOR EACH ROW EXECUTE FUNCTION pyvisor_fence();
    CREATE TRIGGER pyvisor_blob_chunks_fence BEFORE INSERT OR UPDATE ON pyvisor_blob_chunks
        FOR EACH ROW EXECUTE FUNCTION pyvisor_fence();
    "#,
    // 2: a node that drains (`node.drain`) says so to the others and to `cluster.status`;
    // a session keeps the limits it was created with (`session.create`'s `limits`, JSON), so
    // that the node that takes it over applies them.
    r#"
    ALTER TABLE pyvisor_nodes ADD COLUMN draining boolean NOT NULL DEFAULT false;
    ALTER TABLE pyvisor_sessions ADD COLUMN limits text;
    "#,
    // 3: the memory feature's outcomes, patterns, insights shown and feedback, shared by the
    // nodes (docs/memory.md#several-nodes). Every row a node writes takes the next value of
    // `pyvisor_memory_seq`, under an advisory lock, so the rows become visible in the order
    // of their `seq` and a node follows the others by asking for `seq` past the last it saw.
    // Each node's engine takes a block of ids from `pyvisor_memory_id_blocks` at start
    // (ids `block << 32` on), so that two nodes never give one id.
    r#"
    CREATE SEQUENCE pyvisor_memory_seq;
    CREATE SEQUENCE pyvisor_memory_id_blocks;

    CREATE TABLE pyvisor_memory_outcomes (
        id                 bigint PRIMARY KEY,
        seq                bigint NOT NULL,
        node_id            text NOT NULL,
        owner              text NOT NULL,
        session_id         text NOT NULL,
        execution_id       text NOT NULL,
        at_ms              bigint NOT NULL,
        code               text NOT NULL,
        status             text NOT NULL,
        error_type         text,
        error_message      text,
        normalized_message text,
        duration_ms        double precision NOT NULL,
        reads              text NOT NULL,
        meta               text,
        failing_line       integer,
        vector             bytea NOT NULL,
        embedder           text NOT NULL
    );
    CREATE INDEX pyvisor_memory_outcomes_seq ON pyvisor_memory_outcomes (seq);
    CREATE INDEX pyvisor_memory_outcomes_at ON pyvisor_memory_outcomes (at_ms);

    -- A failure pattern is its owner's, error type, normalized message and code shape; the
    -- counts are every node's.
    CREATE TABLE pyvisor_memory_patterns (
        owner              text NOT NULL,
        error_type         text NOT NULL,
        normalized_message text NOT NULL,
        shape              text NOT NULL,
        wrong              bigint NOT NULL DEFAULT 0,
        helpful            bigint NOT NULL DEFAULT 0,
        fired              bigint NOT NULL DEFAULT 0,
        seq                bigint NOT NULL,
        PRIMARY KEY (owner, error_type, normalized_message, shape)
    );
    CREATE INDEX pyvisor_memory_patterns_seq ON pyvisor_memory_patterns (seq);

    CREATE TABLE pyvisor_memory_interruptions (
        id                 bigint PRIMARY KEY,
        seq                bigint NOT NULL,
        node_id            text NOT NULL,
        owner              text NOT NULL,
        session_id         text NOT NULL,
        execution_id       text NOT NULL,
        error_type         text NOT NULL,
        normalized_message text NOT NULL,
        shape              text NOT NULL,
        confidence         double precision NOT NULL,
        message            text NOT NULL,
        suggestion         text,
        at_ms              bigint NOT NULL,
        next_status        text
    );
    CREATE INDEX pyvisor_memory_interruptions_seq ON pyvisor_memory_interruptions (seq);

    CREATE TABLE pyvisor_memory_feedback (
        id                 bigserial PRIMARY KEY,
        node_id            text NOT NULL,
        owner              text NOT NULL,
        insight            bigint,
        outcome            bigint,
        error_type         text,
        normalized_message text,
        shape              text,
        score              smallint NOT NULL,
        comment            text,
        at_ms              bigint NOT NULL
    );
    "#,
    // 4: a session's name is its owner's across the cluster, as it is on one node. Names
    // that two sessions of one owner took on different nodes before this version stay with
    // the older session; the newer keeps its id and loses its name in the directory.
    r#"
    UPDATE pyvisor_sessions s SET name = NULL
    WHERE name IS NOT NULL AND EXISTS (
        SELECT 1 FROM pyvisor_sessions o
        WHERE coalesce(o.owner, '') = coalesce(s.owner, '') AND o.name = s.name
          AND (o.created_at, o.session_id) < (s.created_at, s.session_id));
    CREATE UNIQUE INDEX pyvisor_sessions_owner_name
        ON pyvisor_sessions ((coalesce(owner, '')), name) WHERE name IS NOT NULL;
    "#,
];

/// The schema version this build knows.
pub fn latest() -> i32 {
    MIGRATIONS.len() as i32
}

/// Brings the store's schema to [`latest`] under the migration lock; returns the versions
/// this call applied (none when another node had applied them).
pub async fn apply(client: &mut Client) -> Result<Vec<i32>, ClusterError> {
    let failed = |what| move |source| ClusterError::Store { what, source };
    let tx = client
        .transaction()
        .await
        .map_err(failed("begin the migration"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed("take the migration lock"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS pyvisor_schema (
            version    integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now()
        )",
    )
    .await
    .map_err(failed("create the schema table"))?;
    let current: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM pyvisor_schema", &[])
        .await
        .map_err(failed("read the schema version"))?
        .get(0);
    if current > latest() {
        return Err(ClusterError::Unreachable(format!(
            "the store's schema is version {current}, newer than this node's {}: upgrade this node",
            latest()
        )));
    }
    let mut applied = Vec::new();
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index as i32 + 1;
        let migrate = |source| ClusterError::Migrate { version, source };
        tx.batch_execute(sql).await.map_err(migrate)?;
        tx.execute(
            "INSERT INTO pyvisor_schema (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(migrate)?;
        applied.push(version);
    }
    tx.commit().await.map_err(failed("commit the migration"))?;
    Ok(applied)
}
