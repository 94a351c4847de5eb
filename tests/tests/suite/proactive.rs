//! Proactive computation with real workers: hinted and predicted code is computed ahead in a
//! fork of the worker and answers the request, and never answers stale: not after a mutation
//! through an alias, randomness, a file rewritten on disk, a restore or a rollback. A
//! speculative child that crashes, loops or runs out of memory leaves the session untouched;
//! a request for the snippet being computed joins it.

use std::time::Duration;

use pyvisor::{
    Engine, EngineConfig, ExecuteRequest, ExecutionResult, ExecutionStatus, ProactiveConfig,
    Session, SessionOptions,
};
use pyvisor_actors::proactive::predict::normalise;
use pyvisor_tests::{engine_with, manual_checkpoints, run, within};

/// Proactive settings that do not wait for a quiet machine: tests run side by side.
fn eager() -> ProactiveConfig {
    ProactiveConfig {
        cpu_budget: 1.0,
        yield_to_load: false,
        ..ProactiveConfig::default()
    }
}

async fn engine() -> Engine {
    engine_with(EngineConfig {
        proactive: eager(),
        state: manual_checkpoints(),
        ..EngineConfig::default()
    })
    .await
}

/// A proactive session and a twin that runs everything for real.
async fn sessions(engine: &Engine) -> (Session, Session) {
    let proactive = engine.create_session(Default::default()).await.unwrap();
    let twin = engine
        .create_session(SessionOptions {
            proactive: Some(false),
            ..SessionOptions::default()
        })
        .await
        .unwrap();
    assert!(proactive.proactive() && !twin.proactive());
    (proactive, twin)
}

async fn ok(session: &Session, code: &str) -> ExecutionResult {
    let result = run(session, code).await;
    assert_eq!(result.status, ExecutionStatus::Ok, "{code}: {result:?}");
    result
}

/// Snippets the session's speculations have run so far.
async fn speculations(session: &Session) -> u64 {
    let info = session.info().await.unwrap();
    info.proactive.map_or(0, |share| share.speculations)
}

/// Hints `code` and waits until an answer for each is computed ahead and holds.
async fn computed_ahead(session: &Session, code: &[&str]) {
    hint(session, code).await;
    held(session, code).await;
}

/// Waits until an answer for each of `code` is computed ahead and holds.
async fn held(session: &Session, code: &[&str]) {
    let wanted: Vec<String> = code.iter().map(|c| normalise(c).unwrap()).collect();
    within(async {
        loop {
            let ahead = session.info().await.unwrap().ahead;
            if wanted.iter().all(|normal| ahead.contains(normal)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

/// Hints `code`, which can never be served, and waits until speculation has run it.
async fn speculated(session: &Session, code: &[&str]) {
    let before = speculations(session).await;
    hint(session, code).await;
    within(async {
        loop {
            let info = session.info().await.unwrap();
            let ran = info.proactive.map_or(0, |share| share.speculations);
            if ran >= before + code.len() as u64 && info.speculating.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

async fn hint(session: &Session, code: &[&str]) {
    let hinted = session
        .hint(code.iter().map(|c| c.to_string()).collect())
        .await
        .unwrap();
    assert_eq!(hinted, code.len());
}

/// Runs `code` in both sessions and checks that the answers are the same, byte for byte.
async fn same_answer(proactive: &Session, twin: &Session, code: &str) -> ExecutionResult {
    let answer = run(proactive, code).await;
    let real = run(twin, code).await;
    assert_eq!(
        (
            &answer.status,
            &answer.stdout,
            &answer.stderr,
            &answer.result
        ),
        (&real.status, &real.stdout, &real.stderr, &real.result),
        "{code}"
    );
    assert_eq!(
        (&answer.display, &answer.error),
        (&real.display, &real.error)
    );
    assert_eq!(answer.execution_count, real.execution_count, "{code}");
    answer
}

async fn both(proactive: &Session, twin: &Session, code: &str) {
    ok(proactive, code).await;
    ok(twin, code).await;
}

#[tokio::test]
async fn hinted_code_is_answered_from_speculation() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    both(&session, &twin, "xs = [3, 1, 2]\nprint('bound')").await;
    computed_ahead(&session, &["print(sorted(xs)) or sum(xs)"]).await;
    let answer = same_answer(&session, &twin, "print(sorted(xs))   or sum(xs)  # total").await;
    assert!(answer.from_cache, "{answer:?}");
    assert_eq!(answer.stdout, "[1, 2, 3]\n");
    let stats = engine.stats().await.unwrap().proactive;
    assert!(stats.hits >= 1 && stats.speculations >= 1, "{stats:?}");
    assert_eq!(stats.served_by_source.get("hint"), Some(&1), "{stats:?}");
    // Asked not to use the cache, it runs for real.
    let real = within(session.run(ExecuteRequest::new("sum(xs)").no_cache()))
        .await
        .unwrap();
    assert!(!real.from_cache);
}

#[tokio::test]
async fn a_hint_to_a_session_that_ran_nothing_yet_is_computed() {
    let engine = engine().await;
    let session = engine.create_session(Default::default()).await.unwrap();
    computed_ahead(&session, &["sum(range(10))"]).await;
    assert!(run(&session, "sum(range(10))").await.from_cache);
}

#[tokio::test]
async fn a_named_session_back_from_its_checkpoint_takes_a_hint_before_it_runs_anything() {
    let engine = engine().await;
    let named = || SessionOptions {
        name: Some("kept".to_owned()),
        ..SessionOptions::default()
    };
    let session = engine.create_session(named()).await.unwrap();
    ok(&session, "xs = [3, 1, 2]").await;
    within(session.close_with_checkpoint()).await.unwrap();
    let back = engine.create_session(named()).await.unwrap();
    computed_ahead(&back, &["sorted(xs)"]).await;
    let answer = run(&back, "sorted(xs)").await;
    assert!(answer.from_cache, "{answer:?}");
    assert_eq!(answer.result.unwrap().repr, "[1, 2, 3]");
}

#[tokio::test]
async fn a_closed_session_takes_no_hint() {
    let engine = engine().await;
    let (session, _twin) = sessions(&engine).await;
    let other = session.clone();
    within(session.close()).await.unwrap();
    let taken = within(other.hint(vec!["1 + 1".into()])).await.unwrap();
    assert_eq!(taken, 0);
}

#[tokio::test]
async fn a_session_speculates_no_more_than_the_cache_keeps_for_it() {
    let engine = engine().await;
    let session = engine.create_session(Default::default()).await.unwrap();
    ok(&session, "xs = list(range(100))").await;
    // More snippets than the 50 answers the cache keeps for one session.
    let code: Vec<String> = (0..70).map(|i| format!("xs[{i}] * 3")).collect();
    let code: Vec<&str> = code.iter().map(String::as_str).collect();
    hint(&session, &code).await;
    let ahead = within(async {
        loop {
            let info = session.info().await.unwrap();
            if info.ahead.len() >= 40 && info.speculating.is_empty() {
                return info.ahead;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(
        ahead.len() <= 50,
        "{} answers said to be ahead",
        ahead.len()
    );
    // Each answer the session counts on is still in the cache.
    for normal in &ahead {
        let answer = ok(&session, normal).await;
        assert!(answer.from_cache, "{normal} ran for real");
    }
    // New hints replace the old: answers nothing predicts any more give way to them.
    let newer = ["xs[97] * 5", "xs[98] * 5", "xs[99] * 5"];
    computed_ahead(&session, &newer).await;
    for code in newer {
        assert!(ok(&session, code).await.from_cache, "{code} ran for real");
    }
}

#[tokio::test]
async fn an_answer_gone_stale_is_computed_again_for_the_new_state() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    let setup = "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})";
    both(&session, &twin, setup).await;
    computed_ahead(&session, &["df.shape"]).await;
    both(&session, &twin, "df['b'] = df['a'] * 2").await;
    // The hint still stands: its answer for the old frame is stale, and the next idle
    // moment computes it again, unasked.
    held(&session, &["df.shape"]).await;
    let answer = same_answer(&session, &twin, "df.shape").await;
    assert!(answer.from_cache, "{answer:?}");
    assert_eq!(answer.result.unwrap().repr, "(3, 2)");
}

#[tokio::test]
async fn a_mutation_through_an_alias_is_never_answered_stale() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    let setup = "import pandas as pd\n\
                 df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'x']})\n\
                 box = {'frame': df}\nalias = df";
    both(&session, &twin, setup).await;
    computed_ahead(&session, &["df.shape", "df['a'].sum()"]).await;
    both(&session, &twin, "alias.drop(columns=['b'], inplace=True)").await;
    let answer = same_answer(&session, &twin, "df.shape").await;
    assert_eq!(answer.result.unwrap().repr, "(3, 1)");
    // Through a container the host cannot see: the worker's content check catches it.
    computed_ahead(&session, &["int(df['a'].sum())"]).await;
    both(&session, &twin, "box['frame'].loc[0, 'a'] = 100").await;
    let answer = same_answer(&session, &twin, "int(df['a'].sum())").await;
    assert_eq!(answer.result.unwrap().repr, "105");
}

#[tokio::test]
async fn answers_outlive_a_pure_cell_unless_it_changed_what_they_read() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    let setup = "import pandas as pd\n\
                 df = pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', 'x']})\n\
                 hidden = {'drop': lambda: df.drop(columns=['b'], inplace=True)}";
    both(&session, &twin, setup).await;
    computed_ahead(&session, &["df.shape"]).await;
    // A pure cell reads df and changes nothing: the answer computed before it still holds
    // as soon as the cell's facts are in, before anything could compute it again.
    both(&session, &twin, "df['a'].sum()").await;
    let info = within(async {
        loop {
            let info = session.info().await.unwrap();
            if !info.ahead.is_empty() {
                return info;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let shape = normalise("df.shape").unwrap();
    assert!(info.ahead.contains(&shape), "{:?}", info.ahead);
    let answer = same_answer(&session, &twin, "df.shape").await;
    assert!(answer.from_cache, "{answer:?}");
    // A call the guard cannot see into changes df: the content check refuses the answer.
    computed_ahead(&session, &["list(df.columns)"]).await;
    both(&session, &twin, "hidden['drop']()").await;
    let answer = same_answer(&session, &twin, "list(df.columns)").await;
    assert!(!answer.from_cache, "{answer:?}");
    assert_eq!(answer.result.unwrap().repr, "['a']");
}

#[tokio::test]
async fn randomness_time_and_impure_code_are_never_served() {
    let engine = engine().await;
    let (session, _twin) = sessions(&engine).await;
    ok(
        &session,
        "import random, time\nimport numpy as np\nnp.random.seed(1)\nxs = [1]",
    )
    .await;
    let impure = [
        "np.random.rand()",
        "random.random()",
        "time.time()",
        "xs.append(2)",
        "open('/dev/null', 'w').write('x')",
    ];
    speculated(&session, &impure).await;
    for code in impure {
        let answer = run(&session, code).await;
        assert!(!answer.from_cache, "{code} was served from speculation");
    }
    assert_eq!(ok(&session, "xs").await.result.unwrap().repr, "[1, 2]");
}

#[tokio::test]
async fn a_file_rewritten_on_disk_is_read_again() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("rows.csv");
    std::fs::write(&csv, "a,b\n1,2\n3,4\n").unwrap();
    let setup = format!("import pandas as pd\npath = {:?}", csv.to_str().unwrap());
    both(&session, &twin, &setup).await;
    computed_ahead(&session, &["pd.read_csv(path).shape"]).await;
    std::fs::write(&csv, "a,b\n1,2\n3,4\n5,6\n7,8\n").unwrap();
    let answer = same_answer(&session, &twin, "pd.read_csv(path).shape").await;
    assert_eq!(answer.result.unwrap().repr, "(4, 2)");
    assert!(!answer.from_cache);
}

#[tokio::test]
async fn a_restore_and_a_rollback_are_never_answered_stale() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    both(&session, &twin, "n = [1]").await;
    let saved = session.checkpoint().await.unwrap();
    both(&session, &twin, "n.append(2)").await;
    computed_ahead(&session, &["len(n)"]).await;
    session.restore(Some(&saved.checkpoint_id)).await.unwrap();
    let answer = run(&session, "len(n)").await;
    assert_eq!(answer.result.unwrap().repr, "1");
    assert!(!answer.from_cache);

    computed_ahead(&session, &["len(n)"]).await;
    let failing =
        ExecuteRequest::new("n.append(3)\nraise ValueError('undo')").rollback_on_failure();
    let failed = within(session.run(failing)).await.unwrap();
    assert_eq!(failed.status, ExecutionStatus::Error);
    let answer = run(&session, "len(n)").await;
    assert_eq!(answer.result.unwrap().repr, "1");
}

#[tokio::test]
async fn a_speculative_child_that_crashes_loops_or_overflows_leaves_the_session_alone() {
    let engine = engine().await;
    let (session, _twin) = sessions(&engine).await;
    ok(&session, "import ctypes\nkept = list(range(5))").await;
    let pid = session.info().await.unwrap().pid;
    let hostile = [
        "ctypes.string_at(0)",
        "sum(i * i for i in range(10 ** 12))",
        "len(bytearray(10 ** 12))",
    ];
    for code in hostile {
        speculated(&session, &[code]).await;
    }
    let info = session.info().await.unwrap();
    assert_eq!(info.pid, pid, "the worker itself never died");
    assert_eq!(info.restarts, 0);
    assert_eq!(ok(&session, "sum(kept)").await.result.unwrap().repr, "10");
}

#[tokio::test]
async fn snippets_after_one_that_runs_its_child_out_of_cpu_are_computed_in_the_next() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    both(&session, &twin, "kept = list(range(5))").await;
    let cheap = ["kept[0]", "kept[1]", "kept[2]", "kept[3]"];
    // Planned with the same saving, hints run last first.
    let mut hinted = cheap.to_vec();
    hinted.push("sum(i * i for i in range(10 ** 12))");
    hint(&session, &hinted).await;
    held(&session, &cheap).await;
    for code in cheap {
        assert!(
            same_answer(&session, &twin, code).await.from_cache,
            "{code}"
        );
    }
}

#[tokio::test]
async fn a_request_for_the_snippet_being_computed_joins_it() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    both(&session, &twin, "n = 4 * 10 ** 6").await;
    let slow = "sum(i * i for i in range(n))";
    hint(&session, &[slow]).await;
    within(async {
        while !session
            .info()
            .await
            .unwrap()
            .speculating
            .iter()
            .any(|code| code == slow)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let answer = same_answer(&session, &twin, slow).await;
    assert!(answer.from_cache, "{answer:?}");
    let share = session.info().await.unwrap().proactive.unwrap();
    assert_eq!(share.joins, 1, "{share:?}");
}

#[tokio::test]
async fn an_error_after_a_served_answer_names_the_cell_a_real_run_would() {
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    both(&session, &twin, "v = 2").await;
    computed_ahead(&session, &["v * 21"]).await;
    assert!(same_answer(&session, &twin, "v * 21").await.from_cache);
    // The traceback names the cell by its number: the served answer counted as one.
    same_answer(&session, &twin, "1 / 0").await;
}

#[tokio::test]
async fn frames_forged_by_session_code_are_ignored() {
    // Session code can write to the worker's reply pipe: facts too large to keep, an answer
    // for a speculation that does not exist, an adopt of the running execution nobody asked
    // for. (A frame naming another execution is a protocol error that ends the worker, as
    // any such frame does.)
    let engine = engine().await;
    let (session, twin) = sessions(&engine).await;
    let forge = "import os, json, struct\n\
                 def frame(m):\n    b = json.dumps(m).encode()\n    \
                 os.write(4, struct.pack('>I', len(b)) + b)\n\
                 frame({'type': 'facts', 'id': 'e-1', 'facts': {'reads': [], \
                 'binds': ['n%d' % i for i in range(100000)], 'touched': [], 'files': [], \
                 'ambient': '', 'objects': [], 'pure': False, 'cost_ms': 0}})\n\
                 frame({'type': 'speculated', 'id': 'p-1', 'index': 0, 'outcome': \
                 {'status': 'ok', 'stdout': 'forged', 'stderr': '', 'result': None, \
                 'error': None, 'servable': True, 'cpu_ms': 0, 'duration_ms': 0}})\n\
                 frame({'type': 'adopt_done', 'id': 'e-1', 'fresh': True, 'reason': None})";
    both(&session, &twin, forge).await;
    both(&session, &twin, "v = 5").await;
    computed_ahead(&session, &["v + 1"]).await;
    let answer = same_answer(&session, &twin, "v + 1").await;
    assert_eq!(answer.result.unwrap().repr, "6");
    assert_eq!(session.info().await.unwrap().restarts, 0);
}
