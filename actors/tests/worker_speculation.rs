//! The worker's side of proactive computation with real Python: cell facts, speculative runs
//! in a forked child (the purity guard, byte-identical answers, a child that crashes, loops or
//! is cancelled, the worker's pages taken back after it), and adopting a cached answer while what it read is unchanged.
//!
//! These tests assume pandas and numpy (scripts/test.sh installs them).

use std::path::Path;

use pyvisor_actors::worker::Worker;
use pyvisor_protocol::{
    HostMessage, NameStamp, SpeculativeOutcome, Transaction, WorkerMessage, WorkerStatus,
};

#[allow(
    dead_code,
    reason = "the shared helpers serve several test files; this one needs a few"
)]
mod common;
mod executions;
mod frames;

use executions::{facts, ok, run};
use frames::{next_message, send, start};

fn speculate_message(id: &str, snippets: &[&str], cpu_ms: u64) -> HostMessage {
    HostMessage::Speculate {
        id: id.into(),
        snippets: snippets.iter().map(|s| s.to_string()).collect(),
        repr_limit: 65536,
        output_limit: 65536,
        cpu_ms,
    }
}

/// What a speculation sent: its outcomes by index, its ending and CPU time.
#[derive(Debug, Default)]
struct Speculation {
    outcomes: Vec<(usize, SpeculativeOutcome)>,
    ending: Option<String>,
    cpu_ms: f64,
}

impl Speculation {
    /// Takes one message of speculation `id` in; false for any other message.
    fn take(&mut self, id: &str, message: &WorkerMessage) -> bool {
        match message {
            WorkerMessage::Speculated {
                id: of,
                index,
                outcome,
            } if of == id => self.outcomes.push((*index, (**outcome).clone())),
            WorkerMessage::SpeculationDone {
                id: of,
                ending,
                cpu_ms,
            } if of == id => {
                self.ending = Some(ending.clone());
                self.cpu_ms = *cpu_ms;
            }
            _ => return false,
        }
        true
    }

    fn outcome(&self, index: usize) -> &SpeculativeOutcome {
        &self
            .outcomes
            .iter()
            .find(|(i, _)| *i == index)
            .unwrap_or_else(|| panic!("no outcome for snippet {index}: {self:?}"))
            .1
    }
}

/// Speculates `snippets` and waits for the speculation to end.
async fn speculate(worker: &mut Worker, snippets: &[&str], cpu_ms: u64) -> Speculation {
    send(worker, speculate_message("s", snippets, cpu_ms));
    let mut speculation = Speculation::default();
    while speculation.ending.is_none() {
        let message = next_message(worker).await;
        assert!(speculation.take("s", &message), "unexpected {message:?}");
    }
    speculation
}

/// The outcome of speculating one snippet.
async fn speculate_one(worker: &mut Worker, snippet: &str) -> SpeculativeOutcome {
    let speculation = speculate(worker, &[snippet], 30_000).await;
    assert_eq!(speculation.ending.as_deref(), Some("finished"));
    speculation.outcome(0).clone()
}

/// Asks whether the answer `outcome` to `code` is still fresh: (fresh, reason).
async fn adopt(worker: &mut Worker, code: &str, outcome: &SpeculativeOutcome) -> Option<String> {
    send(
        worker,
        HostMessage::Adopt {
            id: "a".into(),
            code: code.into(),
            reads: outcome.reads.clone(),
            files: outcome.files.clone(),
            ambient: outcome.ambient.clone(),
        },
    );
    match next_message(worker).await {
        WorkerMessage::AdoptDone { id, fresh, reason } if id == "a" => {
            assert_eq!(fresh, reason.is_none(), "{reason:?}");
            reason
        }
        other => panic!("expected adopt_done, got {other:?}"),
    }
}

/// Binds `df`, a frame whose index is labels: a label lookup builds the index's hash table.
async fn labelled_frame(worker: &mut Worker) {
    ok(
        worker,
        "import pandas as pd\ndf = pd.DataFrame({'a': range(5)}, index=list('pqrst'))",
    )
    .await;
}

fn write_csv(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[tokio::test]
async fn facts_say_what_a_cell_read_bound_and_touched() {
    let mut worker = start().await;
    assert!(run(&mut worker, "1 + 1", false).await.facts.is_none());

    let setup = facts(
        &mut worker,
        "import pandas as pd\n\
         df = pd.DataFrame({'a': [1.0, None, 3.0], 'b': ['x', 'y', 'x']})\na = df",
    )
    .await;
    assert_eq!(setup.binds, ["a", "df", "pd"]);
    assert!(!setup.pure);
    let frame = setup
        .objects
        .iter()
        .find(|object| object.name == "df")
        .expect("df is summarised");
    assert_eq!(
        (frame.kind.as_str(), frame.module.as_str()),
        ("DataFrame", "pandas")
    );
    assert_eq!(
        (frame.len, frame.shape.as_slice()),
        (Some(3), [3, 2].as_slice())
    );
    assert_eq!(frame.index.as_deref(), Some("RangeIndex"));
    let columns: Vec<_> = frame
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.label_is_str, c.nulls, c.distinct))
        .collect();
    assert_eq!(columns, [("a", true, 1, 2), ("b", true, 0, 2)]);
    assert_eq!(frame.columns[0].dtype, "float64");

    let drop = facts(&mut worker, "a.drop(columns=['b'], inplace=True)").await;
    assert_eq!(drop.reads, ["a"]);
    assert!(drop.binds.is_empty());
    assert_eq!(
        drop.touched.as_deref(),
        Some(["a", "df"].map(String::from).as_slice())
    );
    assert!(!drop.pure);

    let shape = facts(&mut worker, "df.shape").await;
    assert_eq!(shape.reads, ["df"]);
    assert_eq!(shape.touched.as_deref(), Some([].as_slice()));
    assert!(shape.pure);
    // Calls and assignments of values the guard passes change nothing in place.
    let total = facts(&mut worker, "df['a'].sum()").await;
    assert_eq!(total.touched.as_deref(), Some([].as_slice()));
    let derived = facts(
        &mut worker,
        "small = df[df.a > 1]
large, n = small.copy(), len(small)",
    )
    .await;
    assert_eq!(
        derived.touched.as_deref(),
        Some(["large", "n", "small"].map(String::from).as_slice())
    );
    assert!(!derived.pure);
    let appended = facts(
        &mut worker,
        "rows = []
rows.append(df)",
    )
    .await;
    assert_eq!(
        appended.touched.as_deref(),
        Some(["a", "df", "rows"].map(String::from).as_slice()),
        "a call the guard refuses may change anything it reaches"
    );
    assert!(shape.cost_ms >= 0.0);
    assert_eq!(shape.ambient, drop.ambient);
    let options = facts(&mut worker, "pd.set_option('display.max_rows', 7)").await;
    assert_ne!(options.ambient, shape.ambient);
}

#[tokio::test]
async fn facts_wait_until_no_next_cell_comes() {
    let mut worker = start().await;
    let execute = |id: &str, code: &str| HostMessage::Execute {
        id: id.into(),
        code: code.into(),
        repr_limit: 65536,
        transaction: Transaction::CommitAlways,
        facts: true,
        cell: None,
    };
    // The second cell is in the worker's hands before the first ends: a caller running cells
    // back to back, who gets no facts for the first, not even a frame saying so, and pays
    // nothing for them.
    send(
        &worker,
        execute("first", "import time\ntime.sleep(0.2)\nx = 1"),
    );
    send(&worker, execute("second", "y = x + 1"));
    let mut told = Vec::new();
    while told.len() < 3 {
        match next_message(&mut worker).await {
            WorkerMessage::Result { id, status, .. } => {
                assert_eq!(status, WorkerStatus::Ok, "{id}");
                told.push((id, None));
            }
            WorkerMessage::Facts { id, facts } => told.push((id, Some(facts))),
            other => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(told[0], ("first".to_owned(), None));
    assert_eq!(told[1], ("second".to_owned(), None));
    // Nothing followed the second cell: its facts are there.
    let (id, facts) = &told[2];
    assert_eq!(id, "second");
    let facts = facts
        .as_ref()
        .and_then(|f| f.as_deref())
        .expect("facts of an idle worker");
    assert_eq!(
        (facts.reads.as_slice(), facts.binds.as_slice()),
        (["x".to_owned()].as_slice(), ["y".to_owned()].as_slice())
    );
}

#[tokio::test]
async fn facts_list_the_files_a_cell_read() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write_csv(dir.path(), "data.csv", "k,v\na,1\nb,2\n");
    let mut worker = start().await;
    let read = facts(
        &mut worker,
        &format!("import pandas as pd\ndf = pd.read_csv({csv:?})"),
    )
    .await;
    assert_eq!(read.files.len(), 1, "{:?}", read.files);
    assert_eq!(read.files[0].path, csv);
    assert_eq!(read.files[0].size, 12);
    let written = facts(&mut worker, &format!("df.to_csv({:?})", csv + ".out")).await;
    assert!(written.files.is_empty(), "{:?}", written.files);
}

#[tokio::test]
async fn a_servable_speculation_answers_as_a_real_execution_would() {
    let mut worker = start().await;
    ok(
        &mut worker,
        "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'z']})",
    )
    .await;
    let snippet = "print('rows:', len(df), 'é') or df.describe()";
    let outcome = speculate_one(&mut worker, snippet).await;
    assert!(outcome.servable, "{outcome:?}");
    assert_eq!(outcome.refusal, None);
    assert!(outcome.reads.contains(&NameStamp {
        name: "print".into(),
        fingerprint: None
    }));
    let real = ok(&mut worker, snippet).await;
    assert_eq!(outcome.status, real.status);
    assert_eq!(outcome.stdout, real.stdout);
    assert_eq!(outcome.stderr, real.stderr);
    assert_eq!(outcome.result, real.result);
    assert!(outcome.result.as_ref().unwrap().html.is_some());
}

#[tokio::test]
async fn speculation_leaves_the_namespace_untouched() {
    let mut worker = start().await;
    ok(&mut worker, "x = [1, 2]").await;
    let speculation = speculate(&mut worker, &["x.append(1)", "len(x)"], 30_000).await;
    let append = speculation.outcome(0);
    assert!(!append.servable);
    assert_eq!(append.refusal.as_deref(), Some("calls .append"));
    assert_eq!(append.status, WorkerStatus::Error);
    assert_eq!((&append.result, &append.error), (&None, &None));
    assert_eq!(speculation.outcome(1).result.as_ref().unwrap().repr, "2");
    assert_eq!(ok(&mut worker, "x").await.result.unwrap().repr, "[1, 2]");
}

#[tokio::test]
async fn a_snippet_never_sees_what_an_earlier_pure_one_left_behind() {
    let mut worker = start().await;
    labelled_frame(&mut worker).await;
    // A label lookup builds the index's hash table, a cache the content check cannot see,
    // and the frame's memory usage counts it.
    let usage = "int(df.memory_usage().sum())";
    let speculation = speculate(&mut worker, &["df.loc['q']", usage], 30_000).await;
    assert!(speculation.outcome(0).servable);
    let speculated = speculation.outcome(1);
    assert!(speculated.servable, "{speculated:?}");
    let real = ok(&mut worker, usage).await;
    assert_eq!(
        speculated.result, real.result,
        "as if the lookup had not run"
    );
}

#[tokio::test]
async fn snippets_reading_the_same_objects_each_see_them_as_the_session_holds_them() {
    let mut worker = start().await;
    labelled_frame(&mut worker).await;
    // Each snippet reads only df: the child notes its hidden state once and takes it back
    // to those notes after every snippet.
    let usage = "int(df.memory_usage().sum())";
    let snippets = [
        "df.loc['q']",
        usage,
        "df.loc['r']",
        "df.index.is_unique",
        usage,
    ];
    let speculation = speculate(&mut worker, &snippets, 30_000).await;
    for index in 0..snippets.len() {
        assert!(speculation.outcome(index).servable, "{index}");
    }
    let real = ok(&mut worker, usage).await;
    assert_eq!(speculation.outcome(1).result, real.result);
    assert_eq!(speculation.outcome(4).result, real.result);
}

#[tokio::test]
async fn a_snippet_never_sees_a_cached_property_an_earlier_one_filled() {
    let mut worker = start().await;
    let class = "import functools\nclass Box:\n    @functools.cached_property\n    \
                 def total(self):\n        return 6\nbox = Box()";
    ok(&mut worker, class).await;
    let attributes = "sorted(box.__dict__)";
    let speculation = speculate(&mut worker, &["box.total", attributes], 30_000).await;
    assert_eq!(speculation.outcome(0).result.as_ref().unwrap().repr, "6");
    let real = ok(&mut worker, attributes).await;
    assert_eq!(real.result.as_ref().unwrap().repr, "[]");
    assert_eq!(speculation.outcome(1).result, real.result);
}

#[tokio::test]
async fn snippets_on_a_frame_with_a_multi_index_all_run_in_one_child() {
    let mut worker = start().await;
    let counts =
        "import pandas as pd\nraw = pd.DataFrame({'g': list('aabb'), 'age': [1, 2, 1, 1]})\n\
                  counts = pd.DataFrame(raw.groupby(['g', 'age']).size(), columns=['n'])";
    ok(&mut worker, counts).await;
    // The index's names and levels are lists with attributes of their own (FrozenList).
    let snippets = ["counts", "counts.head()", "counts.unstack()"];
    let speculation = speculate(&mut worker, &snippets, 30_000).await;
    assert_eq!(speculation.ending.as_deref(), Some("finished"));
    for (index, code) in snippets.iter().enumerate() {
        let speculated = speculation.outcome(index);
        assert!(speculated.servable, "{speculated:?}");
        assert_eq!(
            speculated.result,
            ok(&mut worker, code).await.result,
            "{code}"
        );
    }
}

#[tokio::test]
async fn a_snippet_that_leaves_what_cannot_be_taken_back_ends_the_child() {
    let mut worker = start().await;
    ok(&mut worker, "import numpy as np\nx = np.float64(1.0)").await;
    // A warning is shown once per place: the snippets after it would not show theirs.
    let speculation = speculate(&mut worker, &["x / 0", "x / 0", "x + 1"], 30_000).await;
    assert_eq!(speculation.ending.as_deref(), Some("finished"));
    assert_eq!(speculation.outcomes.len(), 1, "{speculation:?}");
    // The warning registry went into the namespace, as `__warningregistry__`.
    assert!(!speculation.outcome(0).servable);
    let again = speculate(&mut worker, &["x / 0"], 30_000).await;
    assert!(
        again.outcome(0).stderr.contains("divide by zero"),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_label_lookup_run_for_real_makes_an_earlier_memory_usage_stale() {
    let mut worker = start().await;
    labelled_frame(&mut worker).await;
    let usage = "int(df.memory_usage().sum())";
    let outcome = speculate_one(&mut worker, usage).await;
    assert_eq!(adopt(&mut worker, usage, &outcome).await, None);
    ok(&mut worker, "df.loc['q']").await;
    let stale = adopt(&mut worker, usage, &outcome).await;
    assert!(stale.is_some_and(|reason| reason.contains("df")));
}

#[tokio::test]
async fn the_guard_refuses_each_impure_form() {
    let mut worker = start().await;
    ok(
        &mut worker,
        "import datetime, os, random, time\nimport numpy as np\nimport pandas as pd\n\
         from os import remove\ndf = pd.DataFrame({'a': [1]})\nx = [1]\ndef f(v):\n    return v\n\
         arr = np.zeros(100_000)",
    )
    .await;
    let table = [
        ("y = 1", "binds names"),
        ("del x", "deletes"),
        ("import os", "imports"),
        (
            "df.drop(columns=['a'], inplace=True)",
            "changes an object in place",
        ),
        ("x.append(2)", "calls .append"),
        // numpy writing into an array it is handed, where a sampled fingerprint may not look
        ("np.place(arr, arr > 0, 7)", "calls .place"),
        ("np.negative.at(arr, [50_001])", "calls .at"),
        (
            "np.multiply(arr, 2, out=arr)",
            "writes into an object it is handed",
        ),
        ("df.to_csv('out.csv')", "writes"),
        ("random.random()", "is random"),
        ("np.random.rand(3)", "is random"),
        ("time.time()", "reads the clock"),
        ("datetime.datetime.now()", "reads the clock"),
        ("input()", "asks for input"),
        ("plt.plot([1, 2])", "plots"),
        ("f(1)", "calls the session's code"),
        ("df.loc[0, 'a'] = 5", "assigns"),
        ("(z := 1)", "assigns"),
        // Handed on rather than called: what it is handed to calls it.
        ("df['a'].map(os.write)", "uses the system"),
        ("list(map(remove, x))", "uses the system"),
        ("df['a'].map(time.sleep)", "reads the clock"),
        ("list(map(eval, ['1']))", "runs dynamic code"),
    ];
    let snippets: Vec<&str> = table.iter().map(|(snippet, _)| *snippet).collect();
    let speculation = speculate(&mut worker, &snippets, 30_000).await;
    for (index, (snippet, refusal)) in table.iter().enumerate() {
        let outcome = speculation.outcome(index);
        assert!(!outcome.servable, "{snippet}");
        assert_eq!(outcome.refusal.as_deref(), Some(*refusal), "{snippet}");
    }
    assert_eq!(
        ok(
            &mut worker,
            "(x, list(df['a']), 'y' in dir(), float(arr.sum()))"
        )
        .await
        .result
        .unwrap()
        .repr,
        "([1], [1], False, 0.0)"
    );
}

#[tokio::test]
async fn an_execute_kills_the_speculation() {
    let mut worker = start().await;
    send(
        &worker,
        speculate_message("s", &["sum(i * i for i in range(10**10))"], 600_000),
    );
    send(
        &worker,
        HostMessage::Execute {
            id: "e".into(),
            code: "1 + 1".into(),
            repr_limit: 100,
            transaction: Transaction::CommitAlways,
            facts: false,
            cell: None,
        },
    );
    let mut speculation = Speculation::default();
    let mut result = None;
    while result.is_none() || speculation.ending.is_none() {
        let message = next_message(&mut worker).await;
        if !speculation.take("s", &message) {
            match message {
                WorkerMessage::Result {
                    id, result: value, ..
                } if id == "e" => result = value,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(result.unwrap().repr, "2");
    assert_eq!(speculation.ending.as_deref(), Some("cancelled"));
    assert!(speculation.outcomes.is_empty());
}

#[tokio::test]
async fn a_cancel_kills_the_speculation_it_names() {
    let mut worker = start().await;
    send(
        &worker,
        speculate_message("s", &["sum(range(10**11))"], 600_000),
    );
    send(&worker, HostMessage::CancelSpeculation { id: "s".into() });
    let mut speculation = Speculation::default();
    while speculation.ending.is_none() {
        let message = next_message(&mut worker).await;
        assert!(speculation.take("s", &message), "unexpected {message:?}");
    }
    assert_eq!(speculation.ending.as_deref(), Some("cancelled"));
}

#[tokio::test]
async fn a_crashing_or_runaway_child_leaves_the_worker_serving() {
    let mut worker = start().await;
    ok(&mut worker, "import ctypes\nx = [1]").await;

    let crash = speculate(&mut worker, &["ctypes.string_at(0)", "len(x)"], 30_000).await;
    assert_eq!(crash.ending.as_deref(), Some("crashed: killed by SIGSEGV"));
    assert!(crash.outcomes.is_empty(), "{crash:?}");

    let runaway = speculate(&mut worker, &["sum(i * i for i in range(10**10))"], 300).await;
    assert_eq!(runaway.ending.as_deref(), Some("cpu_limit"));
    // The child's own CPU time, from its rusage: most of the grant, and not far past it.
    assert!(
        runaway.cpu_ms >= 150.0 && runaway.cpu_ms < 1000.0,
        "{runaway:?}"
    );

    let memory = speculate(&mut worker, &["bytearray(2**62)", "len(x)"], 30_000).await;
    assert_eq!(memory.ending.as_deref(), Some("finished"));
    let failed = memory.outcome(0);
    assert_eq!(failed.error.as_ref().unwrap().type_name, "MemoryError");
    assert_eq!(failed.refusal.as_deref(), Some("raised an error"));
    assert!(memory.outcome(1).servable);

    assert_eq!(ok(&mut worker, "x").await.result.unwrap().repr, "[1]");
}

#[tokio::test]
async fn a_child_that_forges_lines_on_its_outcome_pipe_still_ends() {
    let mut worker = start().await;
    // Session code a snippet runs (a repr) finds the child's outcome pipe and writes a failure
    // that is not text, one far too long, and a line that is not a record, then exits.
    let forge = "import os, stat\n\
                 def forge():\n    \
                 lines = b'[null, {\"not\": \"text\"}]\\n[null, \"' + b'x' * 100000 + b'\"]\\n7\\n'\n    \
                 for fd in range(3, 256):\n        \
                 try:\n            \
                 if stat.S_ISFIFO(os.fstat(fd).st_mode):\n                \
                 os.write(fd, lines)\n        \
                 except OSError:\n            \
                 pass\n    \
                 os._exit(3)\n\
                 class Evil:\n    \
                 def __repr__(self):\n        \
                 forge()\n\
                 evil = [Evil()]\n\
                 x = [1]";
    ok(&mut worker, forge).await;
    let forged = speculate(&mut worker, &["evil[0]"], 30_000).await;
    let ending = forged.ending.clone().expect("the speculation ended");
    assert!(ending.starts_with("crashed: "), "{ending} {forged:?}");
    assert!(ending.len() < 300, "{} bytes", ending.len());
    assert!(forged.outcomes.is_empty(), "{forged:?}");
    assert_eq!(ok(&mut worker, "x").await.result.unwrap().repr, "[1]");
}

/// Page faults the worker takes while adding up 200,000 floats (each addition writes the
/// reference count of one, over some 1,200 pages).
const TOUCH_FLOATS: &str = "before = faults()\ntotal = sum(floats)\nprint(faults() - before)";

async fn faults_touching_floats(worker: &mut Worker) -> u64 {
    let printed = ok(worker, TOUCH_FLOATS).await.stdout;
    printed.trim().parse().unwrap()
}

#[tokio::test]
async fn after_a_speculation_the_worker_writes_its_pages_without_faulting() {
    let mut worker = start().await;
    ok(
        &mut worker,
        "import resource\nfloats = [float(i) for i in range(200_000)]\n\
         faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt",
    )
    .await;
    ok(&mut worker, TOUCH_FLOATS).await;
    let speculation = speculate(&mut worker, &["len(floats)"], 30_000).await;
    assert_eq!(speculation.ending.as_deref(), Some("finished"));
    // The fork write-protected every page; the worker took them back before it said the
    // child was done, so the sum does not fault on each page it writes.
    let faults = faults_touching_floats(&mut worker).await;
    assert!(faults < 100, "{faults} page faults after a speculation");
}

#[tokio::test]
async fn the_worker_takes_back_its_pages_only_once_the_execute_that_killed_the_child_is_done() {
    let mut worker = start().await;
    ok(
        &mut worker,
        "import resource, time\nfloats = [float(i) for i in range(200_000)]\n\
         faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt",
    )
    .await;
    send(
        &worker,
        speculate_message("s", &["1", "sum(i * i for i in range(10**10))"], 600_000),
    );
    let mut speculation = Speculation::default();
    while speculation.outcomes.is_empty() {
        let message = next_message(&mut worker).await;
        assert!(speculation.take("s", &message), "unexpected {message:?}");
    }
    send(
        &worker,
        HostMessage::Execute {
            id: "e".into(),
            code: "time.sleep(0.5)\n'slept'".into(),
            repr_limit: 100,
            transaction: Transaction::CommitAlways,
            facts: false,
            cell: None,
        },
    );
    let mut answered_first = None;
    while speculation.ending.is_none() {
        let message = next_message(&mut worker).await;
        if !speculation.take("s", &message) {
            match message {
                WorkerMessage::Result { id, result, .. } if id == "e" => {
                    assert_eq!(result.unwrap().repr, "'slept'");
                    answered_first.get_or_insert(true);
                }
                other => panic!("unexpected {other:?}"),
            }
        } else {
            answered_first.get_or_insert(false);
        }
    }
    assert_eq!(
        answered_first,
        Some(true),
        "the pages were taken back during the execute"
    );
    assert_eq!(speculation.ending.as_deref(), Some("cancelled"));
    let faults = faults_touching_floats(&mut worker).await;
    assert!(
        faults < 100,
        "{faults} page faults: the pages were not taken back after it"
    );
}

#[tokio::test]
async fn a_binding_snippet_lets_later_snippets_build_on_it() {
    let mut worker = start().await;
    ok(&mut worker, "x = 21").await;
    let speculation = speculate(&mut worker, &["y = x * 2", "y + 1"], 30_000).await;
    let binding = speculation.outcome(0);
    assert_eq!(binding.status, WorkerStatus::Ok);
    assert_eq!(binding.binds, ["y"]);
    assert_eq!(binding.refusal.as_deref(), Some("binds names"));
    assert!(!binding.servable);
    let dependent = speculation.outcome(1);
    assert!(dependent.servable, "{dependent:?}");
    assert_eq!(dependent.result.as_ref().unwrap().repr, "43");

    assert_eq!(
        adopt(&mut worker, "y + 1", dependent).await.as_deref(),
        Some("changed y"),
        "y is not bound in the worker yet"
    );
    ok(&mut worker, "y = x * 2").await;
    assert_eq!(adopt(&mut worker, "y + 1", dependent).await, None);
}

#[tokio::test]
async fn adopt_is_fresh_until_what_was_read_changes() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write_csv(dir.path(), "data.csv", "k,v\na,1\nb,2\n");
    let mut worker = start().await;
    ok(
        &mut worker,
        &format!("import pandas as pd\npath = {csv:?}\ndf = pd.read_csv(path)\na = df"),
    )
    .await;
    let total = speculate_one(&mut worker, "df['v'].sum()").await;
    let reread = speculate_one(&mut worker, "pd.read_csv(path).shape").await;
    assert_eq!(reread.files.len(), 1);
    assert_eq!(reread.files[0].path, csv);
    assert_eq!(adopt(&mut worker, "df['v'].sum()", &total).await, None);
    assert_eq!(
        adopt(&mut worker, "pd.read_csv(path).shape", &reread).await,
        None
    );

    ok(&mut worker, "a.loc[0, 'v'] = 100").await;
    assert_eq!(
        adopt(&mut worker, "df['v'].sum()", &total).await.as_deref(),
        Some("changed df")
    );

    write_csv(dir.path(), "data.csv", "k,v\na,1\nb,2\nc,3\n");
    let reason = adopt(&mut worker, "pd.read_csv(path).shape", &reread).await;
    assert_eq!(reason, Some(format!("changed {csv}")));

    let length = speculate_one(&mut worker, "len(df)").await;
    assert_eq!(adopt(&mut worker, "len(df)", &length).await, None);
    ok(&mut worker, "pd.set_option('display.max_rows', 7)").await;
    assert_eq!(
        adopt(&mut worker, "len(df)", &length).await.as_deref(),
        Some("changed the ambient")
    );
}

#[tokio::test]
async fn adopt_numbers_cells_as_a_real_execution_would() {
    let mut adopting = start().await;
    let mut twin = start().await;
    for worker in [&mut adopting, &mut twin] {
        ok(worker, "x = 1").await;
    }
    let outcome = speculate_one(&mut adopting, "x + 1").await;
    assert_eq!(adopt(&mut adopting, "x + 1", &outcome).await, None);
    ok(&mut twin, "x + 1").await;
    let mut tracebacks = Vec::new();
    for worker in [&mut adopting, &mut twin] {
        let failed = run(worker, "1 / 0", false).await;
        tracebacks.push(failed.error.expect("1 / 0 fails").traceback);
    }
    assert!(
        tracebacks[0].iter().any(|line| line.contains("<cell-3>")),
        "{tracebacks:?}"
    );
    assert_eq!(tracebacks[0], tracebacks[1]);
}
