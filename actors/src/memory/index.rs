//! The in-memory index of outcomes that checks run against (never the disk): per owner, the
//! failures and the successes, each a packed matrix of 8-bit quantised vectors scanned by brute
//! force, with what the detector needs of each outcome next to its row.
//!
//! Failures are scanned first and successes only when a failure matched, so owners whose code
//! does not fail (the common case) pay almost nothing per check. Rows are kept in id order,
//! which is also age order, so retention drops them from the front.
//!
//! A session that runs the same code again and again (a polling loop, a harness's `x += 1`)
//! would fill the index with copies of one success. Such a repeat folds into the session's
//! latest success row of that code, which counts it, as long as no failure of the owner came
//! after that row: checks weigh a row by its count, so what they conclude is the same, and
//! the index grows with what the owner did differently, not with how often.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::embed::may_match;

/// What the detector needs of one outcome, besides its vector.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub id: i64,
    pub session: Arc<str>,
    /// Tokens in the code: code of very different size is not the same approach.
    pub size: u32,
    /// Hashes of the names the code read.
    pub reads: Box<[u64]>,
    /// The failure pattern of a failure.
    pub pattern: Option<u32>,
    /// A failure's original error message (capped).
    pub message: Option<Arc<str>>,
    /// The client's `approach` metadata.
    pub approach: Option<Arc<str>>,
    /// A success that followed a failure in its session: its code (capped), shown as what
    /// worked.
    pub fix: Option<Arc<str>>,
    /// Hash of the code, which tells a repeat of the same code.
    pub code: u64,
    /// Outcomes this row stands for: 1, or more for a success its session repeated.
    pub repeats: u32,
}

impl Entry {
    /// A success that may fold, or be folded into: no follow-up of a failure, no client
    /// metadata (both are shown to users, one row each).
    fn is_plain(&self) -> bool {
        self.fix.is_none() && self.approach.is_none()
    }
}

/// Code compared with the rows: its quantised vector, call signature and size (tokens).
/// A signature or size of 0 matches anything.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub vector: Vec<i8>,
    pub calls: u64,
    pub size: u32,
}

/// What a scan reads of a row before its vector: whether the vector is worth comparing.
#[derive(Debug, Clone, Copy)]
struct RowKey {
    norm: f32,
    /// The signs of the vector's projections on 64 fixed random hyperplanes.
    sketch: u64,
    calls: u64,
    size: u32,
}

impl RowKey {
    /// Whether `probe` may be the same approach as this row: both call something in common
    /// (or one calls nothing), and neither is half the size of the other or less (`len(df)`
    /// is not `1 / (len(df) - len(df))`, however alike their few features are).
    fn may_match(&self, probe: &Probe) -> bool {
        let (small, large) = (self.size.min(probe.size), self.size.max(probe.size));
        may_match(self.calls, probe.calls) && (small == 0 || small * 2 > large)
    }
}

/// A packed matrix of quantised unit vectors and the entries of its rows.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    vectors: Vec<i8>,
    keys: Vec<RowKey>,
    pub entries: Vec<Entry>,
}

impl Rows {
    fn push(&mut self, vector: &[i8], calls: u64, entry: Entry) {
        self.vectors.extend_from_slice(vector);
        self.keys.push(RowKey {
            norm: norm(vector),
            sketch: sketch(vector),
            calls,
            size: entry.size,
        });
        self.entries.push(entry);
    }

    fn drop_front(&mut self, count: usize, dims: usize) {
        let count = count.min(self.entries.len());
        self.entries.drain(..count);
        self.keys.drain(..count);
        self.vectors.drain(..count * dims);
    }

    /// Rows whose cosine similarity to `probe` is at least `min`, with it.
    pub fn scan(&self, probe: &Probe, min: f32) -> Vec<(usize, f32)> {
        self.scan_pieces(std::slice::from_ref(probe), min)
            .into_iter()
            .map(|(row, similarity, _)| (row, similarity))
            .collect()
    }

    /// Rows whose best cosine similarity to any of `pieces` is at least `min`, with it and
    /// the piece it was best with. One pass over the matrix, however many pieces.
    pub fn scan_pieces(&self, pieces: &[Probe], min: f32) -> Vec<(usize, f32, usize)> {
        let norms: Vec<f32> = pieces.iter().map(|piece| norm(&piece.vector)).collect();
        let sketches: Vec<u64> = pieces.iter().map(|piece| sketch(&piece.vector)).collect();
        let Some(dims) = pieces.first().map(|piece| piece.vector.len()) else {
            return Vec::new();
        };
        let max_bits = sketch_bits_within(min);
        let mut hits = Vec::new();
        for (row, key) in self.keys.iter().enumerate() {
            let mut best: Option<(f32, usize)> = None;
            for (piece, (probe, probe_norm)) in pieces.iter().zip(&norms).enumerate() {
                let denominator = probe_norm * key.norm;
                let far = (key.sketch ^ sketches[piece]).count_ones() > max_bits;
                if denominator == 0.0 || far || !key.may_match(probe) {
                    continue;
                }
                let vector = &self.vectors[row * dims..(row + 1) * dims];
                let similarity = dot(&probe.vector, vector) as f32 / denominator;
                if similarity >= min && best.is_none_or(|(b, _)| similarity > b) {
                    best = Some((similarity, piece));
                }
            }
            if let Some((similarity, piece)) = best {
                hits.push((row, similarity, piece));
            }
        }
        hits
    }

    /// The position of the first row with an id above `id`.
    pub fn after(&self, id: i64) -> usize {
        self.entries.partition_point(|entry| entry.id <= id)
    }

    pub fn find_mut(&mut self, id: i64) -> Option<&mut Entry> {
        let at = self
            .entries
            .binary_search_by_key(&id, |entry| entry.id)
            .ok()?;
        Some(&mut self.entries[at])
    }
}

/// One owner's outcomes.
#[derive(Debug, Default)]
pub(crate) struct Shelf {
    pub failures: Rows,
    pub successes: Rows,
}

/// Every owner's outcomes, with the order they came in for retention.
#[derive(Debug)]
pub(crate) struct Index {
    dims: usize,
    shelves: HashMap<Arc<str>, Shelf>,
    /// (id, time in ms, owner, is a failure) of every row, oldest first.
    order: VecDeque<(i64, i64, Arc<str>, bool)>,
    /// Each live session's latest plain success row per code: where its repeats fold.
    fold_targets: HashMap<Arc<str>, FoldTargets>,
}

/// Codes a session's fold targets remember at most; past it they start again.
const FOLD_CODES: usize = 64;

/// One session's latest success row (id) for each code it ran, and the session's owner.
#[derive(Debug)]
struct FoldTargets {
    owner: Arc<str>,
    by_code: HashMap<u64, i64>,
}

impl Index {
    pub fn new(dims: usize) -> Self {
        Self {
            dims,
            shelves: HashMap::new(),
            order: VecDeque::new(),
            fold_targets: HashMap::new(),
        }
    }

    /// Rows held (what `max_outcomes` bounds); folded repeats do not add to it.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// The session is over (or was loaded from the store): its repeats no longer fold.
    pub fn forget_session(&mut self, session: &str) {
        self.fold_targets.remove(session);
    }

    /// No session's repeats fold into what is indexed so far.
    pub fn forget_sessions(&mut self) {
        self.fold_targets.clear();
    }

    pub fn shelf(&self, owner: &str) -> Option<&Shelf> {
        self.shelves.get(owner)
    }

    pub fn shelves(&self) -> impl Iterator<Item = (&Arc<str>, &Shelf)> {
        self.shelves.iter()
    }

    pub fn owners(&self) -> impl Iterator<Item = &Arc<str>> {
        self.shelves.keys()
    }

    pub fn shelf_mut(&mut self, owner: &str) -> Option<&mut Shelf> {
        self.shelves.get_mut(owner)
    }

    /// Adds an outcome, or folds a success into its session's latest success row of the same
    /// code; ids must come in increasing order.
    pub fn insert(
        &mut self,
        owner: &Arc<str>,
        at_ms: i64,
        failure: bool,
        vector: &[i8],
        calls: u64,
        entry: Entry,
    ) {
        debug_assert_eq!(vector.len(), self.dims);
        if failure {
            self.fold_targets.remove(&entry.session);
        } else if entry.is_plain() {
            if self.fold_repeat(owner, &entry) {
                return;
            }
            let targets = self
                .fold_targets
                .entry(entry.session.clone())
                .or_insert_with(|| FoldTargets {
                    owner: owner.clone(),
                    by_code: HashMap::new(),
                });
            if targets.by_code.len() >= FOLD_CODES {
                targets.by_code.clear();
            }
            targets.by_code.insert(entry.code, entry.id);
        }
        self.order
            .push_back((entry.id, at_ms, owner.clone(), failure));
        let shelf = self.shelves.entry(owner.clone()).or_default();
        let rows = if failure {
            &mut shelf.failures
        } else {
            &mut shelf.successes
        };
        rows.push(vector, calls, entry);
    }

    /// Counts the plain success `entry` on its session's latest plain success row of the same
    /// code when no failure of the owner came since (what worked after a failure is looked for
    /// after it by id).
    fn fold_repeat(&mut self, owner: &Arc<str>, entry: &Entry) -> bool {
        let Some(targets) = self.fold_targets.get(&entry.session) else {
            return false;
        };
        if &targets.owner != owner {
            return false;
        }
        let Some(&last_id) = targets.by_code.get(&entry.code) else {
            return false;
        };
        let Some(shelf) = self.shelves.get_mut(owner) else {
            return false;
        };
        if shelf
            .failures
            .entries
            .last()
            .is_some_and(|failure| failure.id > last_id)
        {
            return false;
        }
        match shelf.successes.find_mut(last_id) {
            Some(row) => {
                row.repeats = row.repeats.saturating_add(1);
                true
            }
            None => false,
        }
    }

    /// Drops the oldest rows until at most `max` remain and none is older than `min_at_ms`.
    pub fn prune(&mut self, max: usize, min_at_ms: Option<i64>) -> usize {
        let mut dropped: HashMap<(Arc<str>, bool), usize> = HashMap::new();
        while let Some((_, at_ms, _, _)) = self.order.front() {
            let too_many = self.order.len() > max;
            let too_old = min_at_ms.is_some_and(|min| *at_ms < min);
            if !(too_many || too_old) {
                break;
            }
            let (_, _, owner, failure) = self.order.pop_front().expect("front exists");
            *dropped.entry((owner, failure)).or_default() += 1;
        }
        let mut total = 0;
        for ((owner, failure), count) in dropped {
            total += count;
            if let Some(shelf) = self.shelves.get_mut(&owner) {
                let rows = if failure {
                    &mut shelf.failures
                } else {
                    &mut shelf.successes
                };
                rows.drop_front(count, self.dims);
                if shelf.failures.entries.is_empty() && shelf.successes.entries.is_empty() {
                    self.shelves.remove(&owner);
                }
            }
        }
        total
    }

    /// Failures and successes per owner (outcomes, folded repeats included).
    pub fn counts(&self, owner: Option<&str>) -> (usize, usize) {
        let outcomes = |rows: &Rows| -> usize {
            rows.entries
                .iter()
                .map(|entry| entry.repeats as usize)
                .sum()
        };
        self.shelves
            .iter()
            .filter(|(name, _)| owner.is_none_or(|owner| &***name == owner))
            .fold((0, 0), |(f, s), (_, shelf)| {
                (
                    f + outcomes(&shelf.failures),
                    s + outcomes(&shelf.successes),
                )
            })
    }
}

/// `vector` (unit length) in 8 bits per dimension.
pub(crate) fn quantize(vector: &[f32]) -> Vec<i8> {
    vector
        .iter()
        .map(|x| (x * 127.0).round().clamp(-127.0, 127.0) as i8)
        .collect()
}

/// The signs of `vector`'s projections on 64 fixed pseudo-random hyperplanes (SimHash):
/// two vectors at angle θ differ in each bit with probability θ/π, so the number of bits
/// they differ in bounds their similarity without comparing them.
fn sketch(vector: &[i8]) -> u64 {
    let mut sums = [0i32; 64];
    for (dim, value) in vector.iter().enumerate().filter(|(_, v)| **v != 0) {
        let signs = plane_signs(dim);
        for (plane, sum) in sums.iter_mut().enumerate() {
            let value = i32::from(*value);
            *sum += if signs >> plane & 1 == 1 {
                value
            } else {
                -value
            };
        }
    }
    sums.iter()
        .enumerate()
        .fold(0, |bits, (plane, sum)| bits | u64::from(*sum > 0) << plane)
}

/// The signs of the 64 hyperplanes at dimension `dim` (splitmix64 of it).
fn plane_signs(dim: usize) -> u64 {
    let mut z = (dim as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Most sketch bits in which two vectors of similarity `min` or more differ, but for odds of
/// about 1 in 30,000: four standard deviations above the mean of 64·θ/π.
fn sketch_bits_within(min: f32) -> u32 {
    let p = f64::from(min.clamp(-1.0, 1.0)).acos() / std::f64::consts::PI;
    let limit = 64.0 * p + 4.0 * (64.0 * p * (1.0 - p)).sqrt();
    (limit.ceil() as u32).min(64)
}

fn norm(vector: &[i8]) -> f32 {
    (dot(vector, vector) as f32).sqrt()
}

fn dot(a: &[i8], b: &[i8]) -> i32 {
    // Sixteen lanes at a time, which the compiler turns into vector instructions.
    let mut lanes = [0i32; 16];
    let (a_chunks, b_chunks) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: i32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| i32::from(*x) * i32::from(*y))
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for lane in 0..16 {
            lanes[lane] += i32::from(x[lane]) * i32::from(y[lane]);
        }
    }
    lanes.iter().sum::<i32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: i64) -> Entry {
        Entry {
            id,
            session: "s".into(),
            size: 1,
            reads: Box::new([]),
            pattern: None,
            message: None,
            approach: None,
            fix: None,
            code: 0,
            repeats: 1,
        }
    }

    #[test]
    fn the_sketch_keeps_close_vectors_and_drops_far_ones() {
        use crate::memory::embed::{Embedder, LocalEmbedder};
        let embed = |code: &str| quantize(&LocalEmbedder.embed(code));
        let within = sketch_bits_within(0.85);
        assert!((20..=28).contains(&within), "{within}");
        let (a, b) = (
            embed("df = df.fillna(method='ffill')"),
            embed("out = sales.fillna(method='ffill')"),
        );
        assert!((sketch(&a) ^ sketch(&b)).count_ones() <= within);
        let far = (0..200)
            .filter(|i| {
                let other = embed(&format!("value_{i} = compute_{i}({i})"));
                (sketch(&a) ^ sketch(&other)).count_ones() > within
            })
            .count();
        assert!(far > 150, "{far} of 200 unrelated vectors pruned");
    }

    #[test]
    fn a_session_repeating_successes_folds_them_into_one_row_per_code_until_a_failure() {
        let mut index = Index::new(4);
        let owner: Arc<str> = "alice".into();
        let v = quantize(&[1.0, 0.0, 0.0, 0.0]);
        let success = |id: i64, session: &str, code: u64| Entry {
            session: session.into(),
            code,
            ..entry(id)
        };
        for id in 1..=100 {
            index.insert(&owner, id, false, &v, 0, success(id, "s", 7));
        }
        assert_eq!(index.len(), 1, "100 runs of the same code are one row");
        assert_eq!(index.counts(Some("alice")), (0, 100));
        assert_eq!(
            index.shelf("alice").unwrap().successes.entries[0].repeats,
            100
        );

        // Other code, or the same code in another session, is a row of its own.
        index.insert(&owner, 101, false, &v, 0, success(101, "s", 8));
        index.insert(&owner, 102, false, &v, 0, success(102, "t", 8));
        assert_eq!(index.len(), 3);
        // Codes that take turns in a session fold into their own rows.
        index.insert(&owner, 103, false, &v, 0, success(103, "s", 7));
        index.insert(&owner, 104, false, &v, 0, success(104, "s", 8));
        assert_eq!(index.len(), 3);
        assert_eq!(index.counts(Some("alice")), (0, 104));

        // After a failure of the owner, the next success is a row: what worked after the
        // failure is found after it by id.
        index.insert(&owner, 105, true, &v, 0, success(105, "t", 9));
        index.insert(&owner, 106, false, &v, 0, success(106, "s", 7));
        assert_eq!(index.len(), 5);
        index.insert(&owner, 107, false, &v, 0, success(107, "s", 7));
        assert_eq!(index.len(), 5);

        // A closed session's repeats, and a success that follows up a failure, never fold.
        index.forget_session("s");
        index.insert(&owner, 108, false, &v, 0, success(108, "s", 7));
        let fix = Entry {
            fix: Some("x = 1".into()),
            ..success(109, "s", 7)
        };
        index.insert(&owner, 109, false, &v, 0, fix);
        assert_eq!(index.len(), 7);
        assert_eq!(index.counts(None), (1, 108));
    }

    #[test]
    fn scan_finds_close_rows_and_prune_drops_the_oldest() {
        let mut index = Index::new(4);
        let owner: Arc<str> = "alice".into();
        let a = quantize(&[1.0, 0.0, 0.0, 0.0]);
        let b = quantize(&[0.0, 1.0, 0.0, 0.0]);
        let probe = Probe {
            vector: a.clone(),
            calls: 0,
            size: 1,
        };
        index.insert(&owner, 10, true, &a, 0, entry(1));
        index.insert(&owner, 20, true, &b, 0, entry(2));
        index.insert(&owner, 30, false, &a, 0, entry(3));
        let hits = index.shelf("alice").unwrap().failures.scan(&probe, 0.9);
        assert_eq!(hits.len(), 1);
        assert!((hits[0].1 - 1.0).abs() < 1e-3);
        assert_eq!(index.prune(2, None), 1);
        assert_eq!(index.counts(Some("alice")), (1, 1));
        assert_eq!(index.prune(10, Some(25)), 1);
        assert_eq!(index.counts(None), (0, 1));
        assert!(index.shelf("bob").is_none());
    }
}
