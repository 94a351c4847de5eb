//! Checkpoints copied between a node's local checkpoint store and the shared one.
//!
//! The shared store keeps the latest checkpoint of each session: a row with its metadata (a
//! JSON manifest) and the worker's index, both zstd-compressed, and the blobs that hold the
//! values of its groups, content-addressed per session (XXH3-128) and cut into zstd-compressed
//! chunks of [`CHUNK_BYTES`]. An upload sends only the blobs the store does not hold yet, and
//! drops those the new checkpoint no longer refers to, all in one transaction that carries the
//! writer's epoch: the store's fence refuses it when another node has claimed the session
//! since ([`ClusterError::Fenced`]).
//!
//! A download writes the blobs to a private directory, checks each against its hash and
//! length, and saves the checkpoint into the local store as that session's newest, from which
//! the session's worker restores it as after a crash.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use pyvisor_actors::checkpoint::{
    CheckpointId, CheckpointMeta, CheckpointStore, GroupSource, LostName, NewCheckpoint, NewGroup,
};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::directory::is_fenced;
use super::store::Store;
use crate::errors::ClusterError;

/// Bytes of a blob per chunk row, before compression.
pub const CHUNK_BYTES: usize = 1024 * 1024;

/// zstd's fastest level: checkpoints are on their way to the store while the session serves.
const ZSTD_LEVEL: i32 = 1;

/// The most a manifest or an index may take once decompressed: a corrupt or hostile row must
/// not exhaust the node's memory.
const MAX_DECOMPRESSED: usize = 256 * 1024 * 1024;

/// What the shared store keeps of a checkpoint beside its blobs.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    /// Executions of the session up to this checkpoint, counted across the nodes that held it.
    execution_count: u64,
    names_saved: Vec<String>,
    names_lost: Vec<LostName>,
    groups: Vec<Group>,
}

/// One group of names and the blob that holds their values.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Group {
    token: String,
    names: Vec<String>,
    /// The blob's XXH3-128, in hexadecimal.
    blob: String,
    bytes: u64,
}

/// A checkpoint uploaded to the shared store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uploaded {
    pub checkpoint_id: String,
    /// Blob bytes sent (before compression); blobs the store held already are not sent again.
    pub sent_bytes: u64,
    /// Bytes written to the store, compressed.
    pub stored_bytes: u64,
}

/// The checkpoint the shared store had for a session, now the newest of the local store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// The id the node that wrote it gave it.
    pub checkpoint_id: String,
    /// The node that wrote it.
    pub node_id: String,
    /// Executions of the session up to it, across nodes.
    pub execution_count: u64,
    /// Its id in the local store.
    pub local_id: CheckpointId,
}

/// Where one checkpoint goes and under what: the session, its key in the local store, and
/// the node and epoch that write it.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub session_id: &'a str,
    pub key: &'a str,
    pub node_id: &'a str,
    pub epoch: i64,
}

fn failed(what: &'static str) -> impl Fn(tokio_postgres::Error) -> ClusterError {
    move |source| ClusterError::Store { what, source }
}

/// Uploads checkpoint `id` of the local store's session `writer.key` as the session's latest
/// in the shared store, under `writer.epoch`, with its execution count (the session's, across
/// nodes: an engine that took the session over counts on from the checkpoint it restored).
pub async fn upload(
    store: &Store,
    local: &CheckpointStore,
    writer: Writer<'_>,
    id: CheckpointId,
) -> Result<Uploaded, ClusterError> {
    let checkpoint_id = id.to_string();
    let fail = |message: String| ClusterError::Checkpoint {
        session_id: writer.session_id.to_owned(),
        checkpoint: checkpoint_id.clone(),
        message,
    };
    let (local_copy, key) = (local.clone(), writer.key.to_owned());
    let loaded = tokio::task::spawn_blocking(move || {
        let loaded = local_copy.load(&key, Some(id)).map_err(|e| e.to_string())?;
        let hashes = (loaded.groups.iter())
            .map(|group| hash_file(&group.path, group.bytes).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>();
        Ok::<_, String>((loaded, hashes))
    })
    .await
    .map_err(|e| fail(e.to_string()))?
    .map_err(fail)?;
    let (loaded, hashes) = loaded;
    let restore_dir = loaded.restore_dir.clone();
    let outcome = async {
        let hashes = hashes.map_err(fail)?;
        let manifest = Manifest {
            execution_count: loaded.info.meta.execution_count,
            names_saved: loaded.info.meta.names_saved.clone(),
            names_lost: loaded.info.meta.names_lost.clone(),
            groups: (loaded.groups.iter().zip(&hashes))
                .map(|(group, hash)| Group {
                    token: group.token.clone(),
                    names: group.names.clone(),
                    blob: hash.clone(),
                    bytes: group.bytes,
                })
                .collect(),
        };
        let files: BTreeMap<String, PathBuf> = (hashes.iter().cloned())
            .zip(loaded.groups.iter().map(|group| group.path.clone()))
            .collect();
        write(
            store,
            &writer,
            &checkpoint_id,
            &manifest,
            &loaded.payload,
            files,
        )
        .await
    }
    .await;
    if let Some(dir) = restore_dir {
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }
    outcome
}

/// The transaction of an upload: the checkpoint row first (the fence), then the blobs the
/// store lacks, then the removal of blobs no longer referred to.
async fn write(
    store: &Store,
    writer: &Writer<'_>,
    checkpoint_id: &str,
    manifest: &Manifest,
    payload: &[u8],
    files: BTreeMap<String, PathBuf>,
) -> Result<Uploaded, ClusterError> {
    let fenced = |source: tokio_postgres::Error, what| {
        if is_fenced(&source) {
            ClusterError::Fenced {
                session_id: writer.session_id.to_owned(),
                epoch: writer.epoch,
            }
        } else {
            ClusterError::Store { what, source }
        }
    };
    let manifest_json = serde_json::to_vec(manifest).expect("a manifest is plain data");
    let (manifest_z, payload_z) = (compress(&manifest_json), compress(payload));
    let mut stored_bytes = (manifest_z.len() + payload_z.len()) as u64;
    let mut client = store.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(failed("begin a checkpoint upload"))?;
    let execution_count = manifest.execution_count as i64;
    tx.execute(
        "INSERT INTO pyvisor_checkpoints
             (session_id, checkpoint_id, epoch, node_id, execution_count, manifest, payload)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (session_id) DO UPDATE SET
             checkpoint_id = EXCLUDED.checkpoint_id, epoch = EXCLUDED.epoch,
             node_id = EXCLUDED.node_id, execution_count = EXCLUDED.execution_count,
             manifest = EXCLUDED.manifest, payload = EXCLUDED.payload, created_at = now()",
        &[
            &writer.session_id,
            &checkpoint_id,
            &writer.epoch,
            &writer.node_id,
            &execution_count,
            &manifest_z,
            &payload_z,
        ],
    )
    .await
    .map_err(|e| fenced(e, "write the checkpoint to the cluster store"))?;
    let wanted: Vec<&str> = files.keys().map(String::as_str).collect();
    let held: HashSet<String> = tx
        .query(
            "SELECT DISTINCT blob FROM pyvisor_blob_chunks
             WHERE session_id = $1 AND blob = ANY($2)",
            &[&writer.session_id, &wanted],
        )
        .await
        .map_err(failed("list the blobs in the cluster store"))?
        .into_iter()
        .map(|row| row.get(0))
        .collect();
    let insert = tx
        .prepare(
            "INSERT INTO pyvisor_blob_chunks (session_id, blob, seq, epoch, data)
             VALUES ($1, $2, $3, $4, $5)",
        )
        .await
        .map_err(failed("prepare the blob upload"))?;
    let mut sent_bytes = 0;
    for (blob, path) in files.iter().filter(|(blob, _)| !held.contains(*blob)) {
        let unreadable = |err: io::Error| ClusterError::Checkpoint {
            session_id: writer.session_id.to_owned(),
            checkpoint: checkpoint_id.to_owned(),
            message: format!("read blob {blob}: {err}"),
        };
        let mut file = Some(File::open(path).map_err(unreadable)?);
        let mut seq: i32 = 0;
        loop {
            // A chunk at a time: the node holds one chunk of a blob in memory, not the blob.
            let mut taken = file.take().expect("the file is put back after each chunk");
            let (back, chunk) = tokio::task::spawn_blocking(move || {
                let chunk = read_chunk(&mut taken);
                (taken, chunk)
            })
            .await
            .map_err(|err| unreadable(io::Error::other(err)))?;
            file = Some(back);
            let (read, chunk) = chunk.map_err(unreadable)?;
            if read == 0 && seq > 0 {
                break;
            }
            sent_bytes += read as u64;
            stored_bytes += chunk.len() as u64;
            tx.execute(
                &insert,
                &[&writer.session_id, blob, &seq, &writer.epoch, &chunk],
            )
            .await
            .map_err(|e| fenced(e, "write a blob to the cluster store"))?;
            seq += 1;
            if read < CHUNK_BYTES {
                break;
            }
        }
    }
    tx.execute(
        "DELETE FROM pyvisor_blob_chunks WHERE session_id = $1 AND NOT (blob = ANY($2))",
        &[&writer.session_id, &wanted],
    )
    .await
    .map_err(failed("drop unused blobs from the cluster store"))?;
    tx.commit()
        .await
        .map_err(|e| fenced(e, "commit the checkpoint upload"))?;
    Ok(Uploaded {
        checkpoint_id: checkpoint_id.to_owned(),
        sent_bytes,
        stored_bytes,
    })
}

/// Makes the shared store's latest checkpoint of `session_id` the newest one of the local
/// store's session `key`, its blobs written under `scratch` first. `None` when the shared
/// store has no checkpoint of the session.
pub async fn download(
    store: &Store,
    local: &CheckpointStore,
    scratch: &Path,
    session_id: &str,
    key: &str,
) -> Result<Option<Downloaded>, ClusterError> {
    match fetch(store, scratch, session_id).await? {
        Some(fetched) => Ok(Some(fetched.save(local, key).await?)),
        None => Ok(None),
    }
}

/// The shared store's latest checkpoint of a session, its blobs written (and checked) in a
/// private directory, not yet in the local store: [`Fetched::save`] puts it there, without
/// the store.
pub struct Fetched {
    session_id: String,
    checkpoint_id: String,
    node_id: String,
    execution_count: u64,
    meta: CheckpointMeta,
    payload: Vec<u8>,
    groups: Vec<NewGroup>,
    /// Holds the blob files until the local store takes them in.
    dir: tempfile::TempDir,
}

/// The first half of [`download`]: the shared store's latest checkpoint of `session_id`,
/// its blobs written under `scratch`; `None` when the store has none. The store's
/// connection is held for this half only.
pub async fn fetch(
    store: &Store,
    scratch: &Path,
    session_id: &str,
) -> Result<Option<Fetched>, ClusterError> {
    let client = store.client().await?;
    let Some(row) = client
        .query_opt(
            "SELECT checkpoint_id, node_id, execution_count, manifest, payload
             FROM pyvisor_checkpoints WHERE session_id = $1",
            &[&session_id],
        )
        .await
        .map_err(failed("read the checkpoint from the cluster store"))?
    else {
        return Ok(None);
    };
    let checkpoint_id: String = row.get(0);
    let fail = |message: String| ClusterError::Checkpoint {
        session_id: session_id.to_owned(),
        checkpoint: checkpoint_id.clone(),
        message,
    };
    let manifest: Manifest = decompress(row.get(3))
        .and_then(|json| serde_json::from_slice(&json).map_err(io::Error::other))
        .map_err(|err| fail(format!("read its manifest: {err}")))?;
    let payload = decompress(row.get(4)).map_err(|err| fail(format!("read its index: {err}")))?;
    let dir = tempfile::Builder::new()
        .prefix("cluster-restore-")
        .tempdir_in(scratch)
        .map_err(|err| {
            fail(format!(
                "create a directory in {}: {err}",
                scratch.display()
            ))
        })?;
    let chunks = client
        .prepare(
            "SELECT data FROM pyvisor_blob_chunks
             WHERE session_id = $1 AND blob = $2 ORDER BY seq",
        )
        .await
        .map_err(failed("prepare the blob download"))?;
    let mut groups = Vec::with_capacity(manifest.groups.len());
    for (index, group) in manifest.groups.iter().enumerate() {
        // One file per group: the local store takes each file in (moves it).
        let path = dir.path().join(format!("{index}-{}", group.blob));
        let rows = client
            .query(&chunks, &[&session_id, &group.blob])
            .await
            .map_err(failed("read a blob from the cluster store"))?;
        let data: Vec<Vec<u8>> = rows.iter().map(|row| row.get(0)).collect();
        let target = path.clone();
        let written = tokio::task::spawn_blocking(move || write_blob(&target, &data))
            .await
            .map_err(io::Error::other)
            .and_then(|written| written)
            .map_err(|err| fail(format!("write blob {}: {err}", group.blob)))?;
        if written != (group.blob.clone(), group.bytes) {
            return Err(fail(format!(
                "blob {} of {} bytes came back as {} of {} bytes",
                group.blob, group.bytes, written.0, written.1
            )));
        }
        groups.push(NewGroup {
            token: group.token.clone(),
            names: group.names.clone(),
            source: GroupSource::File(path),
        });
    }
    // The session restored from it counts its executions on from its count.
    let execution_count = u64::try_from(row.get::<_, i64>(2)).unwrap_or(0);
    let meta = CheckpointMeta {
        execution_count,
        names_saved: manifest.names_saved.clone(),
        names_lost: manifest.names_lost.clone(),
    };
    Ok(Some(Fetched {
        session_id: session_id.to_owned(),
        checkpoint_id,
        node_id: row.get(1),
        execution_count,
        meta,
        payload,
        groups,
        dir,
    }))
}

impl Fetched {
    /// Makes it the newest checkpoint of the local store's session `key` (the blobs' fsyncs
    /// are here: the part of a download that needs no store connection).
    pub async fn save(
        self,
        local: &CheckpointStore,
        key: &str,
    ) -> Result<Downloaded, ClusterError> {
        let Fetched {
            session_id,
            checkpoint_id,
            node_id,
            execution_count,
            meta,
            payload,
            groups,
            dir,
        } = self;
        let (local, key) = (local.clone(), key.to_owned());
        let saved = tokio::task::spawn_blocking(move || {
            let saved = local.save_checkpoint(
                &key,
                NewCheckpoint {
                    meta: &meta,
                    payload: &payload,
                    groups: &groups,
                    max_state_bytes: u64::MAX,
                    seed: None,
                },
            );
            drop(dir);
            saved
        })
        .await;
        let fail = |message: String| ClusterError::Checkpoint {
            session_id: session_id.clone(),
            checkpoint: checkpoint_id.clone(),
            message,
        };
        let saved = saved
            .map_err(|err| fail(err.to_string()))?
            .map_err(|err| fail(format!("save it locally: {err}")))?;
        Ok(Downloaded {
            checkpoint_id,
            node_id,
            execution_count,
            local_id: saved.id,
        })
    }
}

/// The XXH3-128 of the first `bytes` bytes of `path`, in hexadecimal.
fn hash_file(path: &Path, bytes: u64) -> io::Result<String> {
    let mut hasher = Xxh3::new();
    let mut file = File::open(path)?.take(bytes);
    let mut buffer = vec![0; CHUNK_BYTES];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(format!("{:032x}", hasher.digest128()))
}

/// The next chunk of `file`, compressed, and how many bytes it held before compression.
fn read_chunk(file: &mut File) -> io::Result<(usize, Vec<u8>)> {
    let mut buffer = Vec::with_capacity(CHUNK_BYTES);
    let read = file.take(CHUNK_BYTES as u64).read_to_end(&mut buffer)?;
    Ok((read, compress(&buffer)))
}

/// Writes the decompressed `chunks` to a new file at `path`; its hash and length.
fn write_blob(path: &Path, chunks: &[Vec<u8>]) -> io::Result<(String, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    let (mut hasher, mut bytes) = (Xxh3::new(), 0u64);
    for chunk in chunks {
        let data = zstd::bulk::decompress(chunk, CHUNK_BYTES)?;
        hasher.update(&data);
        bytes += data.len() as u64;
        file.write_all(&data)?;
    }
    // No fsync here: the local store fsyncs each blob as it takes it in.
    Ok((format!("{:032x}", hasher.digest128()), bytes))
}

fn compress(data: &[u8]) -> Vec<u8> {
    zstd::bulk::compress(data, ZSTD_LEVEL).expect("zstd compresses any bytes in memory")
}

/// Decompresses a manifest or an index, at most [`MAX_DECOMPRESSED`] bytes.
fn decompress(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(data)?
        .take(MAX_DECOMPRESSED as u64 + 1)
        .read_to_end(&mut out)?;
    if out.len() > MAX_DECOMPRESSED {
        return Err(io::Error::other(format!(
            "larger than {MAX_DECOMPRESSED} bytes decompressed"
        )));
    }
    Ok(out)
}
