//! Opening the memory: its store (SQLite of its own, or one several engines share), the index
//! loaded from what the store holds, and, for a shared store, what the other engines record
//! taken in as it comes.

use super::core::{indexed_text, stored_status};
use super::*;

impl Memory {
    /// A memory with `config`; with a store path, what it holds is loaded first. A store that
    /// cannot be opened or read leaves the memory working from memory alone, with a warning.
    pub fn open(config: MemoryConfig, embedder: Arc<dyn Embedder>) -> Memory {
        let path = config.path.clone();
        let open = path.map(|path| {
            move || SqliteStore::open(&path).map(|store| Box::new(store) as Box<dyn OutcomeStore>)
        });
        let opener = open.as_ref().map(|open| open as &dyn Fn() -> Opened);
        Self::open_from(config, embedder, opener).0
    }

    /// A memory whose store several engines share (`open` opens a connection to it): its
    /// ids come from a range the store gives this engine, and a thread of its own takes in
    /// what the other engines record, every `every`, so that a check here knows their
    /// failures within about that long (docs/memory.md). The checks never wait for the
    /// store; a store that fails leaves the memory working from what it holds, with a
    /// warning.
    pub fn open_shared(
        config: MemoryConfig,
        embedder: Arc<dyn Embedder>,
        open: &dyn Fn() -> Opened,
        every: Duration,
    ) -> Arc<Memory> {
        let (memory, mark) = Self::open_from(config, embedder, Some(open));
        let memory = Arc::new(memory);
        if memory.writer.is_none() {
            return memory;
        }
        let follow = open().map_err(|err| err.to_string()).and_then(|store| {
            follow(Arc::downgrade(&memory), store, mark, every).map_err(|err| err.to_string())
        });
        if let Err(detail) = follow {
            memory.health.degrade(&StoreError {
                path: memory.store.clone().unwrap_or_default(),
                kind: StoreFailure::Other,
                detail: format!("follow the other engines' outcomes: {detail}"),
            });
        }
        memory
    }

    /// A memory from the stores `open` opens (one to write, one to read), loaded from the
    /// first; and where [`OutcomeStore::changes`] goes on from.
    fn open_from(
        config: MemoryConfig,
        embedder: Arc<dyn Embedder>,
        open: Option<&dyn Fn() -> Opened>,
    ) -> (Memory, i64) {
        let health = Arc::new(Health::default());
        let mut loaded = Loaded::default();
        let (mut writer, mut reader, mut location, mut id_base) = (None, None, None, None);
        if let Some(open) = open {
            let since = config.max_age.map(|age| now_ms() - age.as_millis() as i64);
            let opened = open().and_then(|mut store| {
                let found = store.load(config.max_outcomes, since)?;
                let base = store.id_base()?;
                let second = open()?;
                Ok((store, second, found, base))
            });
            match opened {
                Ok((store, second, found, base)) => {
                    loaded = found;
                    id_base = base;
                    let at = store.location();
                    match Writer::start(store, health.clone()) {
                        Ok(started) => {
                            // What the bounds left out of the load goes from the disk too.
                            if since.is_some() {
                                started.send(Write::Prune {
                                    max: config.max_outcomes,
                                    before_ms: since,
                                });
                            }
                            writer = Some(started);
                            location = Some(at);
                        }
                        Err(err) => health.degrade(&StoreError {
                            path: at,
                            kind: StoreFailure::Other,
                            detail: format!("start the memory thread: {err}"),
                        }),
                    }
                    reader = Some(Mutex::new(second));
                }
                Err(err) => health.degrade(&err),
            }
        }
        let mut knowledge = Knowledge {
            index: Index::new(embedder.dims()),
            patterns: Patterns::from_records(std::mem::take(&mut loaded.patterns)),
            last_failed: HashMap::new(),
        };
        let next_outcome = loaded.outcomes.last().map_or(1, |o| o.id + 1);
        reembed(&mut loaded.outcomes, embedder.as_ref());
        for outcome in loaded.outcomes.drain(..) {
            knowledge.take_in(&outcome, embedder.as_ref());
        }
        knowledge.last_failed.clear();
        knowledge.index.forget_sessions();
        let next_interruption = loaded.interruptions.last().map_or(1, |(id, _, _)| id + 1);
        let interruptions = loaded
            .interruptions
            .into_iter()
            .map(|(id, owner, pattern)| {
                let shown = Shown {
                    owner: owner.into(),
                    pattern,
                    outcome: None,
                };
                (id, shown)
            })
            .collect();
        let memory = Memory {
            config,
            embedder,
            knowledge: RwLock::new(knowledge),
            sessions: Mutex::default(),
            recent: Mutex::default(),
            interruptions: Mutex::new(interruptions),
            figures: Mutex::default(),
            next_outcome: AtomicI64::new(id_base.map_or(next_outcome, |base| base + 1)),
            next_interruption: AtomicI64::new(id_base.map_or(next_interruption, |base| base + 1)),
            health,
            store: location,
            reader,
            writer,
        };
        (memory, loaded.mark)
    }

    /// Takes in what other engines sharing the store wrote: their outcomes into the index,
    /// their insights (so that feedback on them is taken here), and the feedback and firings
    /// of the patterns, by the largest count either side knows (one's own not yet in the
    /// store stays counted). Patterns new here go to the store's thread, which knows each
    /// pattern by its number here.
    pub(super) fn absorb(&self, mut changes: Changes) {
        reembed(&mut changes.outcomes, self.embedder.as_ref());
        let mut new_patterns = Vec::new();
        let mut shown = Vec::with_capacity(changes.interruptions.len());
        {
            let mut knowledge = self.knowledge.write().unwrap_or_else(|e| e.into_inner());
            let mut intern = |knowledge: &mut Knowledge, key: &PatternRecord| {
                let (id, new) = knowledge.patterns.intern(
                    &key.owner,
                    &key.error_type,
                    &key.normalized_message,
                    &key.shape,
                );
                let pattern = knowledge.patterns.get_mut(id).expect("an interned pattern");
                pattern.wrong = pattern.wrong.max(key.wrong);
                pattern.right = pattern.right.max(key.right);
                pattern.fired = pattern.fired.max(key.fired);
                if new {
                    new_patterns.push(pattern.clone());
                }
                id
            };
            for pattern in &changes.patterns {
                intern(&mut knowledge, pattern);
            }
            for (id, key) in &changes.interruptions {
                let pattern = intern(&mut knowledge, key);
                shown.push((*id, key.owner.as_str().into(), pattern));
            }
            for outcome in &changes.outcomes {
                new_patterns.extend(knowledge.take_in(outcome, self.embedder.as_ref()));
            }
            if knowledge.index.len() > self.config.max_outcomes as usize + PRUNE_SLACK {
                let before_ms = self
                    .config
                    .max_age
                    .map(|age| now_ms() - age.as_millis() as i64);
                knowledge
                    .index
                    .prune(self.config.max_outcomes as usize, before_ms);
            }
        }
        let mut interruptions = self.interruptions.lock().unwrap_or_else(|e| e.into_inner());
        for (id, owner, pattern) in shown {
            interruptions.entry(id).or_insert(Shown {
                owner,
                pattern,
                outcome: None,
            });
        }
        drop(interruptions);
        if let Some(writer) = &self.writer {
            for pattern in new_patterns {
                writer.send(Write::Pattern(pattern));
            }
        }
    }
}

/// Outcomes stored with another embedder's vectors get this one's, in batches (one request
/// per batch for a remote embedder).
pub(super) fn reembed(outcomes: &mut [OutcomeRecord], embedder: &dyn Embedder) {
    const BATCH: usize = 256;
    let stale: Vec<usize> = (0..outcomes.len())
        .filter(|&i| {
            outcomes[i].embedder != embedder.name() || outcomes[i].vector.len() != embedder.dims()
        })
        .collect();
    for chunk in stale.chunks(BATCH) {
        let texts: Vec<&str> = chunk
            .iter()
            .map(|&i| {
                let outcome = &outcomes[i];
                let (_, _, failure) = stored_status(outcome);
                indexed_text(&outcome.code, failure, outcome.failing_line)
            })
            .collect();
        let vectors: Vec<Vec<i8>> = embedder
            .embed_batch(&texts)
            .iter()
            .map(|vector| quantize(vector))
            .collect();
        for (&i, vector) in chunk.iter().zip(vectors) {
            outcomes[i].vector = vector;
            outcomes[i].embedder = embedder.name().to_owned();
        }
    }
}
