//! The promise of proactive computation, as a property: whatever a session runs (aliasing,
//! in-place mutation, randomness, the clock, display options, files rewritten on disk between
//! cells) and however long it pauses, with every random generator seeded alike, every answer of a proactive session equals, byte for
//! byte, the answer of a twin that runs everything for real.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use pyvisor::{Engine, EngineConfig, ExecutionResult, ProactiveConfig, Session, SessionOptions};
use pyvisor_tests::{engine_with, manual_checkpoints, run};

const SETUP: &str = "import pandas as pd, numpy as np, random, time, datetime\n\
                     xs = [1, 2, 3]\n\
                     df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'x']})\n\
                     box = {'k': xs}\nalias = df\nys = xs\nnp.random.seed(0)\nrandom.seed(0)";

/// Cells that bind, mutate (directly, through an alias or a container), reseed, change
/// display options or write files.
const CHANGES: &[&str] = &[
    "xs.append(len(xs))",
    "box['k'].append(7)",
    "ys.extend([9])",
    "alias.loc[0, 'a'] = int(alias['a'].sum())",
    "alias.drop(index=alias.index[-1:], inplace=True)",
    "df = df.assign(c=df['a'] * 2)",
    "alias = df",
    "ys = list(xs)",
    "random.seed(5)",
    "np.random.seed(3)",
    "pd.set_option('display.max_rows', 3)",
    "pd.reset_option('display.max_rows')",
    "frame = pd.read_csv('data.csv')",
    "open('note.txt', 'w').write(str(len(xs)))",
];

/// Pure expressions, and a few impure ones that must never be served.
const QUESTIONS: &[&str] = &[
    "xs",
    "len(xs)",
    "sum(ys)",
    "box",
    "df",
    "df.shape",
    "int(df['a'].sum())",
    "alias.head()",
    "df.describe()",
    "frame.shape",
    "pd.read_csv('data.csv').shape",
    "open('note.txt').read()",
    "np.random.rand()",
    "random.random()",
    "time.time() > 0",
    "datetime.datetime.now().year > 2000",
];

/// One step of a scenario.
#[derive(Debug, Clone)]
enum Step {
    Change(usize),
    Ask(usize),
    /// The host rewrites data.csv with this many rows.
    Rewrite(usize),
    /// A pause before the next step, in milliseconds.
    Think(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..CHANGES.len()).prop_map(Step::Change),
        5 => (0..QUESTIONS.len()).prop_map(Step::Ask),
        1 => (1usize..6).prop_map(Step::Rewrite),
        3 => (0u64..120).prop_map(Step::Think),
    ]
}

fn write_csv(dir: &Path, rows: usize) {
    let mut text = String::from("a,b\n");
    for row in 0..rows {
        text.push_str(&format!("{row},{}\n", row * 3));
    }
    std::fs::write(dir.join("data.csv"), text).unwrap();
}

fn same(answer: &ExecutionResult, real: &ExecutionResult) -> bool {
    answer.status == real.status
        && answer.execution_count == real.execution_count
        && answer.stdout == real.stdout
        && answer.stderr == real.stderr
        && answer.result == real.result
        && answer.display == real.display
        && answer.error == real.error
}

async fn pair(engine: &Engine, dir: &Path) -> (Session, Session) {
    let options = |proactive| SessionOptions {
        cwd: Some(dir.to_owned()),
        proactive: Some(proactive),
        ..SessionOptions::default()
    };
    let proactive = engine.create_session(options(true)).await.unwrap();
    let twin = engine.create_session(options(false)).await.unwrap();
    (proactive, twin)
}

/// Runs `steps` in a proactive session and its twin; fails on the first answer that differs.
async fn play(engine: &Engine, steps: &[Step], served: &AtomicU64) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    write_csv(dir.path(), 2);
    let (session, twin) = pair(engine, dir.path()).await;
    let outcome = replay(&session, &twin, dir.path(), steps, served).await;
    session.close().await.unwrap();
    twin.close().await.unwrap();
    outcome
}

async fn replay(
    session: &Session,
    twin: &Session,
    dir: &Path,
    steps: &[Step],
    served: &AtomicU64,
) -> Result<(), TestCaseError> {
    let questions: Vec<String> = QUESTIONS.iter().map(|q| q.to_string()).collect();
    let mut steps = steps.iter();
    let mut next = Some(SETUP);
    loop {
        if let Some(code) = next.take() {
            let answer = run(session, code).await;
            let real = run(twin, code).await;
            prop_assert!(
                same(&answer, &real),
                "{code}\nproactive: {answer:?}\nreal: {real:?}"
            );
            if answer.from_cache {
                served.fetch_add(1, Ordering::Relaxed);
            }
            session.hint(questions.clone()).await.unwrap();
        }
        match steps.next() {
            None => break,
            Some(Step::Change(i)) => next = Some(CHANGES[*i]),
            Some(Step::Ask(i)) => next = Some(QUESTIONS[*i]),
            Some(Step::Rewrite(rows)) => write_csv(dir, *rows),
            Some(Step::Think(ms)) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        }
    }
    Ok(())
}

async fn eager_engine() -> Engine {
    engine_with(EngineConfig {
        proactive: ProactiveConfig {
            cpu_budget: 1.0,
            yield_to_load: false,
            ..ProactiveConfig::default()
        },
        state: manual_checkpoints(),
        ..EngineConfig::default()
    })
    .await
}

/// Found by the property (pandas 3.1): a real run of `alias.head()` empties the warning
/// registries (pandas uses `catch_warnings()` inside), a served answer does not, so the twin
/// printed the deprecation warning of the second in-place drop and the proactive session did not.
#[tokio::test]
async fn a_served_answer_leaves_later_warnings_as_a_real_run_would() {
    let engine = eager_engine().await;
    let served = AtomicU64::new(0);
    let steps = [
        Step::Change(4),
        Step::Think(150),
        Step::Ask(7),
        Step::Change(4),
    ];
    play(&engine, &steps, &served).await.unwrap();
}

#[test]
fn every_answer_of_a_proactive_session_equals_a_real_run() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let engine = runtime.block_on(eager_engine());
    let served = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let scenarios = proptest::collection::vec(step(), 6..18);
    let outcome = runner.run(&scenarios, |steps| {
        runtime.block_on(play(&engine, &steps, &served))
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
    // The property says nothing if nothing was ever served.
    assert!(
        served.load(Ordering::Relaxed) > 0,
        "no answer came from speculation"
    );
}
