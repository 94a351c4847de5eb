//! The learned table: what real analysis sessions ran after what, as templates, counted on
//! the training corpus by `examples/learn_templates.rs` and committed as `templates.json`.
//!
//! Read-only at run time; [`Table::builtin`] parses the committed copy once. The committed
//! copy was counted on the facts trace of the whole training corpus (98 sequences, 2,015
//! cells, recorded by `examples/record_facts.rs`):
//!
//! ```sh
//! cargo run --release -p pyvisor-actors --example learn_templates -- \
//!     /tmp/facts-train.jsonl --out actors/src/proactive/predict/templates.json
//! ```
//!
//! A folder of training sequences (the corpus is not part of the repository) works too, with facts
//! read from the code: no object kinds or column classes then.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::edits::Edits;
use super::rank::Ranker;

/// What followed one context in the corpus.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Followers {
    /// Cells seen after this context.
    pub total: u32,
    /// Distinct templates among them.
    pub distinct: u32,
    /// The most frequent servable ones (single expressions), relative to the context,
    /// most frequent first.
    pub top: Vec<(String, u32)>,
}

impl Followers {
    /// The share of the probability this context keeps before backing off to a more
    /// general one (Witten-Bell).
    pub fn weight(&self) -> f64 {
        let total = f64::from(self.total);
        total / (total + f64::from(self.distinct.max(1)))
    }
}

/// Hits of one kind of guess over the times it was offered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rate {
    pub hits: u64,
    pub trials: u64,
}

impl Rate {
    /// The hit rate with a weak prior of one hit in `prior_trials`.
    pub fn smoothed(&self, prior_trials: f64) -> f64 {
        (self.hits as f64 + 1.0) / (self.trials as f64 + prior_trials)
    }
}

/// Everything learned from the corpus.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// Cells counted.
    pub cells: u64,
    /// Context key (see `SessionModel::contexts`) to what followed it.
    pub next: BTreeMap<String, Followers>,
    /// `var_rank[r]`: how often a free variable slot was filled by the `r`-th most recent
    /// data object, as a share of all free variable slots.
    pub var_rank: Vec<f64>,
    /// The same for a free column slot and the column ranking of `ranked_columns`.
    pub col_rank: Vec<f64>,
    /// Template to the kinds of object its `$0` held, with counts.
    pub kinds: BTreeMap<String, BTreeMap<String, u32>>,
    /// Template to the classes of column its `$c0` held, with counts.
    pub col_classes: BTreeMap<String, BTreeMap<String, u32>>,
    /// How often each kind of history guess was right, by kind and age of the cell it
    /// comes from (see `HistoryGuess::rate_key`).
    #[serde(default)]
    pub history: BTreeMap<String, Rate>,
    /// Chain contexts (the last cell with its last trailers dropped, see `chain.rs`) to the
    /// trailers the next cell added, relative to the kept part: keyed by the dropped
    /// trailers as written (`-1:.max()`), by their shape (`-1~._()`) and by their number
    /// only (`-1:*`).
    #[serde(default)]
    pub chain: BTreeMap<String, Followers>,
    /// The keywords and members the history source edits the last cell with (`edits.rs`).
    #[serde(default)]
    pub edits: Edits,
    /// How often a column was accessed as an attribute (`df.a`) rather than a subscript.
    #[serde(default)]
    pub attribute_columns: Rate,
    /// Mean runtime of each template in the corpus, in milliseconds.
    pub runtime_ms: BTreeMap<String, f64>,
    /// The weights that rank pooled guesses (`rank.rs`), fitted on repositories left out of
    /// the counts; without them a guess's probability is its sources' share.
    #[serde(default)]
    pub ranker: Option<Ranker>,
}

/// How many misses the prior of one history rate is worth.
const HISTORY_PRIOR_TRIALS: f64 = 100.0;

static BUILTIN: OnceLock<Table> = OnceLock::new();

impl Table {
    /// The table committed with pyvisor, learned from the training corpus.
    pub fn builtin() -> &'static Table {
        BUILTIN.get_or_init(|| {
            serde_json::from_str(include_str!("templates.json"))
                .expect("the committed templates.json is a valid table")
        })
    }

    /// The share of free variable slots filled by the `rank`-th most recent object.
    pub fn var_rank(&self, rank: usize) -> f64 {
        rank_share(&self.var_rank, rank)
    }

    /// The hit rate of history guesses counted under `key`; low when never counted.
    pub fn history_rate(&self, key: &str) -> f64 {
        self.history
            .get(key)
            .copied()
            .unwrap_or_default()
            .smoothed(HISTORY_PRIOR_TRIALS)
    }

    /// The share of free column slots filled by the `rank`-th ranked column.
    pub fn col_rank(&self, rank: usize) -> f64 {
        rank_share(&self.col_rank, rank)
    }

    /// How well an object of `kind` fits `$0` of `template`, 1 for the commonest kind; 1 when
    /// nothing was learned.
    pub fn kind_fit(&self, template: &str, kind: &str) -> f64 {
        fit(self.kinds.get(template), kind)
    }

    /// How well a column of `class` fits `$c0` of `template`; `None` when nothing was learned.
    pub fn class_fit(&self, template: &str, class: &str) -> Option<f64> {
        self.col_classes
            .get(template)
            .map(|counts| fit(Some(counts), class))
    }
}

fn rank_share(shares: &[f64], rank: usize) -> f64 {
    match shares.get(rank) {
        Some(&share) => share,
        // Past the learned ranks: less than the last one, and falling.
        None => shares.last().copied().unwrap_or(0.05) / (rank + 2 - shares.len()) as f64,
    }
}

fn fit(counts: Option<&BTreeMap<String, u32>>, key: &str) -> f64 {
    let Some(counts) = counts else {
        return 1.0;
    };
    let known: BTreeMap<&String, &u32> =
        counts.iter().filter(|(k, _)| !k.starts_with('?')).collect();
    if known.is_empty() || key.starts_with('?') {
        return 1.0;
    }
    let max = known.values().map(|&&c| c).max().unwrap_or(0);
    let count = counts.get(key).copied().unwrap_or(0);
    (f64::from(count) + 1.0) / (f64::from(max) + 1.0)
}
