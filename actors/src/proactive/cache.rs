//! The CacheActor: speculative answers waiting to be served, for every session of an engine.
//!
//! Sessions [`Store`] the answers their speculations produce and [`Take`] one when a request
//! for its code arrives; whether it may still be served is the session's call (it owns the
//! versions of its names, [`ReadKey`]) and the worker's (it checks the content). The cache
//! bounds what it holds: entries live [`CacheLimits::ttl`], a session keeps at most
//! [`CacheLimits::per_session`] (its least recently used go first), and the whole cache at
//! most [`CacheLimits::bytes`], evicting the least recently used entry of any session.
//! A restore, a crash or a close [`ForgetSession`]s a session's entries.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use pyvisor_protocol::SpeculativeOutcome;

use super::stats::ProactiveCounters;
use super::versions::ReadKey;

/// What the cache may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    pub ttl: Duration,
    pub per_session: usize,
    pub bytes: u64,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(300),
            per_session: 50,
            bytes: 100 * 1024 * 1024,
        }
    }
}

/// One speculative answer.
#[derive(Debug)]
pub struct CacheEntry {
    pub outcome: SpeculativeOutcome,
    /// What must still hold for it to be served.
    pub key: ReadKey,
    /// The prediction source that proposed it (a metric label).
    pub source: &'static str,
    /// The session's count of real executions when its speculation forked: while it is
    /// still the count, the namespace is exactly what the answer read.
    pub forked_at: u64,
}

impl CacheEntry {
    /// Approximate bytes the entry holds.
    pub fn bytes(&self) -> u64 {
        let outcome = &self.outcome;
        let result = outcome.result.as_ref().map_or(0, |r| {
            r.repr.len() + r.type_name.len() + r.html.as_ref().map_or(0, String::len)
        });
        let display: usize = outcome
            .display
            .iter()
            .map(|d| d.mime.len() + d.data.len())
            .sum();
        let reads: usize = outcome
            .reads
            .iter()
            .map(|r| r.name.len() + r.fingerprint.as_ref().map_or(0, String::len))
            .sum();
        (outcome.stdout.len() + outcome.stderr.len() + result + display + reads + 256) as u64
    }
}

/// Keep `entry` as the answer to code of normal form `normal` in `session_id`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Store {
    pub session_id: Arc<str>,
    pub normal: String,
    pub entry: Arc<CacheEntry>,
}

/// The answer to `normal` in `session_id`, if the cache holds one (now counted as used).
#[derive(Message)]
#[rtype(result = "Option<Arc<CacheEntry>>")]
pub struct Take {
    pub session_id: Arc<str>,
    pub normal: String,
}

/// Drop the entries of `session_id` for `normals`: answers the session knows are stale.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Discard {
    pub session_id: Arc<str>,
    pub normals: Vec<String>,
}

/// Drop every entry of `session_id`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ForgetSession {
    pub session_id: Arc<str>,
}

/// The cache's size: (entries, bytes, most bytes ever held).
#[derive(Message)]
#[rtype(result = "CacheSize")]
pub struct GetCacheSize;

/// What [`GetCacheSize`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub struct CacheSize {
    pub entries: usize,
    pub bytes: u64,
    pub peak_bytes: u64,
}

type EntryId = (Arc<str>, String);

struct Held {
    entry: Arc<CacheEntry>,
    bytes: u64,
    stored: Instant,
    /// Its position in `CacheActor::by_use`.
    used: u64,
}

/// The actor holding every session's speculative answers.
pub struct CacheActor {
    limits: CacheLimits,
    counters: Arc<ProactiveCounters>,
    entries: HashMap<EntryId, Held>,
    /// Entries by last use, oldest first.
    by_use: BTreeMap<u64, EntryId>,
    per_session: HashMap<Arc<str>, usize>,
    clock: u64,
    bytes: u64,
    peak_bytes: u64,
}

impl CacheActor {
    pub fn new(limits: CacheLimits, counters: Arc<ProactiveCounters>) -> Self {
        Self {
            limits,
            counters,
            entries: HashMap::new(),
            by_use: BTreeMap::new(),
            per_session: HashMap::new(),
            clock: 0,
            bytes: 0,
            peak_bytes: 0,
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn remove(&mut self, id: &EntryId) -> Option<Held> {
        let held = self.entries.remove(id)?;
        self.by_use.remove(&held.used);
        self.bytes -= held.bytes;
        if let Some(count) = self.per_session.get_mut(&id.0) {
            *count -= 1;
            if *count == 0 {
                self.per_session.remove(&id.0);
            }
        }
        Some(held)
    }

    /// Removes `id` as an answer that was never served.
    fn discard(&mut self, id: &EntryId) {
        if self.remove(id).is_some() {
            self.counters.discarded(1);
        }
    }

    /// Evicts least recently used entries until `session` has room for one more and the
    /// cache for `bytes` more.
    fn make_room(&mut self, session: &Arc<str>, bytes: u64) {
        while self.per_session.get(session).copied().unwrap_or(0) >= self.limits.per_session {
            let oldest = self
                .by_use
                .values()
                .find(|(owner, _)| owner == session)
                .cloned();
            match oldest {
                Some(id) => self.discard(&id),
                None => break,
            }
        }
        while self.bytes + bytes > self.limits.bytes {
            let Some(id) = self.by_use.values().next().cloned() else {
                break;
            };
            self.discard(&id);
        }
    }

    fn expire(&mut self, now: Instant) {
        let ttl = self.limits.ttl;
        let expired: Vec<EntryId> = self
            .entries
            .iter()
            .filter(|(_, held)| now.duration_since(held.stored) >= ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            self.discard(&id);
        }
        self.counters.cache_size(self.bytes);
    }
}

impl Actor for CacheActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let every =
            (self.limits.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(30));
        ctx.run_interval(every, |act, _| act.expire(Instant::now()));
    }
}

impl Handler<Store> for CacheActor {
    type Result = ();

    fn handle(&mut self, msg: Store, _: &mut Context<Self>) {
        let id = (msg.session_id, msg.normal);
        self.discard(&id);
        let bytes = msg.entry.bytes();
        if bytes > self.limits.bytes {
            self.counters.discarded(1);
            return;
        }
        self.make_room(&id.0, bytes);
        let used = self.tick();
        self.by_use.insert(used, id.clone());
        *self.per_session.entry(id.0.clone()).or_default() += 1;
        self.entries.insert(
            id,
            Held {
                entry: msg.entry,
                bytes,
                stored: Instant::now(),
                used,
            },
        );
        self.bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.bytes);
        self.counters.cache_size(self.bytes);
    }
}

impl Handler<Take> for CacheActor {
    type Result = Option<Arc<CacheEntry>>;

    fn handle(&mut self, msg: Take, _: &mut Context<Self>) -> Self::Result {
        let id = (msg.session_id, msg.normal);
        let now = Instant::now();
        let fresh = self
            .entries
            .get(&id)
            .is_some_and(|held| now.duration_since(held.stored) < self.limits.ttl);
        if !fresh {
            self.discard(&id);
            self.counters.cache_size(self.bytes);
            return None;
        }
        let used = self.tick();
        let held = self.entries.get_mut(&id).expect("checked just above");
        self.by_use.remove(&held.used);
        held.used = used;
        self.by_use.insert(used, id.clone());
        Some(held.entry.clone())
    }
}

impl Handler<Discard> for CacheActor {
    type Result = ();

    fn handle(&mut self, msg: Discard, _: &mut Context<Self>) {
        for normal in msg.normals {
            self.discard(&(msg.session_id.clone(), normal));
        }
        self.counters.cache_size(self.bytes);
    }
}

impl Handler<ForgetSession> for CacheActor {
    type Result = ();

    fn handle(&mut self, msg: ForgetSession, _: &mut Context<Self>) {
        let ids: Vec<EntryId> = self
            .entries
            .keys()
            .filter(|(session, _)| *session == msg.session_id)
            .cloned()
            .collect();
        for id in ids {
            self.discard(&id);
        }
        self.counters.cache_size(self.bytes);
    }
}

impl Handler<GetCacheSize> for CacheActor {
    type Result = CacheSize;

    fn handle(&mut self, _: GetCacheSize, _: &mut Context<Self>) -> CacheSize {
        CacheSize {
            entries: self.entries.len(),
            bytes: self.bytes,
            peak_bytes: self.peak_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use pyvisor_protocol::WorkerStatus;

    use super::*;

    fn entry(stdout_bytes: usize) -> Arc<CacheEntry> {
        Arc::new(CacheEntry {
            outcome: SpeculativeOutcome {
                status: WorkerStatus::Ok,
                stdout: "x".repeat(stdout_bytes),
                stderr: String::new(),
                result: None,
                display: Vec::new(),
                error: None,
                servable: true,
                refusal: None,
                reads: Vec::new(),
                files: Vec::new(),
                ambient: String::new(),
                binds: Vec::new(),
                cpu_ms: 1.0,
                duration_ms: 1.0,
            },
            key: ReadKey {
                epoch: 0,
                ambient: String::new(),
                reads: Vec::new(),
            },
            source: "namespace",
            forked_at: 0,
        })
    }

    async fn store(cache: &Addr<CacheActor>, session: &str, normal: &str, bytes: usize) {
        cache
            .send(Store {
                session_id: session.into(),
                normal: normal.into(),
                entry: entry(bytes),
            })
            .await
            .unwrap();
    }

    async fn has(cache: &Addr<CacheActor>, session: &str, normal: &str) -> bool {
        let take = Take {
            session_id: session.into(),
            normal: normal.into(),
        };
        cache.send(take).await.unwrap().is_some()
    }

    fn cache(limits: CacheLimits) -> (Addr<CacheActor>, Arc<ProactiveCounters>) {
        let counters = Arc::new(ProactiveCounters::default());
        (CacheActor::new(limits, counters.clone()).start(), counters)
    }

    #[actix::test]
    async fn the_byte_cap_evicts_the_least_recently_used() {
        let per_entry = entry(10_000).bytes();
        let (cache, counters) = cache(CacheLimits {
            bytes: per_entry * 3,
            ..CacheLimits::default()
        });
        for name in ["a", "b", "c"] {
            store(&cache, "s1", name, 10_000).await;
        }
        assert!(
            has(&cache, "s1", "a").await,
            "a is used: b is now the oldest"
        );
        store(&cache, "s2", "d", 10_000).await;
        assert!(!has(&cache, "s1", "b").await);
        for name in ["a", "c"] {
            assert!(has(&cache, "s1", name).await, "{name}");
        }
        assert!(has(&cache, "s2", "d").await);
        let size = cache.send(GetCacheSize).await.unwrap();
        assert!(size.bytes <= per_entry * 3 && size.peak_bytes <= per_entry * 3);
        assert_eq!(counters.stats().discarded, 1);
    }

    #[actix::test]
    async fn a_session_keeps_at_most_its_share() {
        let (cache, _) = cache(CacheLimits {
            per_session: 2,
            ..CacheLimits::default()
        });
        for name in ["a", "b", "c"] {
            store(&cache, "s1", name, 10).await;
        }
        store(&cache, "s2", "a", 10).await;
        assert!(!has(&cache, "s1", "a").await);
        assert!(has(&cache, "s1", "b").await && has(&cache, "s1", "c").await);
        assert!(
            has(&cache, "s2", "a").await,
            "another session's entries stay"
        );
    }

    #[actix::test]
    async fn entries_expire_and_sessions_are_forgotten() {
        let (cache, _) = cache(CacheLimits {
            ttl: Duration::ZERO,
            ..CacheLimits::default()
        });
        store(&cache, "s1", "a", 10).await;
        assert!(!has(&cache, "s1", "a").await, "past its ttl");
        let (cache, _) = cache_with_default();
        store(&cache, "s1", "a", 10).await;
        store(&cache, "s2", "a", 10).await;
        cache
            .send(ForgetSession {
                session_id: "s1".into(),
            })
            .await
            .unwrap();
        assert!(!has(&cache, "s1", "a").await);
        assert!(has(&cache, "s2", "a").await);
    }

    #[actix::test]
    async fn stale_answers_are_discarded_by_name() {
        let (cache, counters) = cache_with_default();
        for name in ["a", "b"] {
            store(&cache, "s1", name, 10).await;
        }
        store(&cache, "s2", "a", 10).await;
        let normals = vec!["a".to_string(), "never stored".to_string()];
        cache
            .send(Discard {
                session_id: "s1".into(),
                normals,
            })
            .await
            .unwrap();
        assert!(!has(&cache, "s1", "a").await);
        assert!(has(&cache, "s1", "b").await && has(&cache, "s2", "a").await);
        assert_eq!(counters.stats().discarded, 1);
    }

    fn cache_with_default() -> (Addr<CacheActor>, Arc<ProactiveCounters>) {
        cache(CacheLimits::default())
    }

    #[actix::test]
    async fn an_entry_larger_than_the_cache_is_not_kept() {
        let (cache, _) = cache(CacheLimits {
            bytes: 1000,
            ..CacheLimits::default()
        });
        store(&cache, "s1", "a", 5000).await;
        assert!(!has(&cache, "s1", "a").await);
        assert_eq!(cache.send(GetCacheSize).await.unwrap().bytes, 0);
    }
}
