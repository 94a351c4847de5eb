//! The load-test harness (`pyvisor loadtest`, `pyvisor::loadtest`): scenario errors, the
//! lost-state detector against a deliberately injected loss, the report's arithmetic on an
//! operation of known duration, the smoke scenario of examples/loadtest (which fails on any
//! wrong answer or lost state), a socket run with client faults, a daemon killed and
//! restarted under load, a cluster node killed and restarted under load, and the command's
//! exit statuses and `--compare`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::Daemon;
use pyvisor::loadtest::{self, LoadtestError, Scenario, COUNTER};

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/loadtest")
}

fn parse(text: &str) -> Result<Scenario, LoadtestError> {
    Scenario::from_toml(text, Path::new("."))
}

/// The message of a scenario that must not parse.
fn scenario_error(text: &str) -> String {
    match parse(text) {
        Err(LoadtestError::Scenario(message)) => message,
        other => panic!("expected a scenario error for {text:?}, got {other:?}"),
    }
}

const HEAD: &str = "iterations = 1\n[target]\nkind = \"embedded\"\n";

#[test]
fn scenario_mistakes_are_named_clearly() {
    let unknown = scenario_error(&format!("{HEAD}[[op]]\nkind = \"explode\"\n"));
    assert!(unknown.contains("op[0].kind"), "{unknown}");
    assert!(unknown.contains("unknown variant `explode`"), "{unknown}");
    assert!(
        unknown.contains("print_flood"),
        "the known kinds are listed: {unknown}"
    );

    let zero = scenario_error(&format!(
        "{HEAD}[[op]]\nkind = \"execute\"\ncode = \"1\"\nweight = 0\n"
    ));
    assert_eq!(zero, "op[0] (execute): weight: must be more than 0, got 0");
    let negative = scenario_error(&format!(
        "{HEAD}[[op]]\nkind = \"checkpoint\"\n[[op]]\nkind = \"execute\"\ncode = \"1\"\nweight = -2\n"
    ));
    assert!(
        negative.starts_with("op[1] (execute): weight"),
        "{negative}"
    );
    let typed = scenario_error(&format!(
        "{HEAD}[[op]]\nkind = \"execute\"\nweight = \"x\"\n"
    ));
    assert!(typed.starts_with("op[0].weight: invalid type"), "{typed}");

    let no_code = scenario_error(&format!("{HEAD}[[op]]\nkind = \"execute\"\n"));
    assert_eq!(no_code, "op[0] (execute): set exactly one of code and file");
    let no_ops = scenario_error(HEAD);
    assert_eq!(no_ops, "op: at least one [[op]] is needed");
    let no_end = scenario_error("[target]\nkind = \"embedded\"\n[[op]]\nkind = \"checkpoint\"\n");
    assert_eq!(no_end, "set duration_s or iterations");
    let unknown_key = scenario_error(&format!(
        "{HEAD}clients_n = 3\n[[op]]\nkind = \"checkpoint\"\n"
    ));
    assert!(
        unknown_key.contains("unknown field `clients_n`"),
        "{unknown_key}"
    );
    let socket_fault = scenario_error(&format!(
        "{HEAD}[[op]]\nkind = \"checkpoint\"\n[[fault]]\nkind = \"slow_client\"\nevery_s = 1\n"
    ));
    assert_eq!(
        socket_fault,
        "fault[0] (slow_client): needs the socket or daemon target"
    );
    let kill_daemon = |target: &str| {
        scenario_error(&format!(
            "iterations = 1\n[target]\n{target}\n[[op]]\nkind = \"checkpoint\"\n\
             [[fault]]\nkind = \"kill_daemon\"\nat_s = [1]\n"
        ))
    };
    let not_ours = kill_daemon("kind = \"socket\"");
    assert!(not_ours.contains("needs the daemon target"), "{not_ours}");
    let debounced = kill_daemon("kind = \"daemon\"");
    assert!(
        debounced.contains("needs durability = \"reply\""),
        "{debounced}"
    );
    let node_kill = |target: &str| {
        scenario_error(&format!(
            "iterations = 1\n[target]\n{target}\n[[op]]\nkind = \"checkpoint\"\n\
             [[fault]]\nkind = \"node_kill\"\nat_s = [1]\n"
        ))
    };
    let not_a_cluster = node_kill("kind = \"daemon\"");
    assert!(
        not_a_cluster.contains("needs the cluster target"),
        "{not_a_cluster}"
    );
    let alone = node_kill("kind = \"cluster\"\nnodes = 1");
    assert_eq!(
        alone,
        "fault[0] (node_kill): needs at least 2 nodes, so that another one takes the sessions over"
    );
    let no_nodes = node_kill("kind = \"cluster\"\nnodes = 0");
    assert_eq!(no_nodes, "target.nodes: must be at least 1");
    let no_lease = node_kill("kind = \"cluster\"\nlease_ttl_s = -1");
    assert_eq!(no_lease, "target.lease_ttl_s: must be more than 0, got -1");
    let two_schedules = scenario_error(&format!(
        "{HEAD}[[op]]\nkind = \"checkpoint\"\n[[fault]]\nkind = \"kill_worker\"\nevery_s = 1\nat_s = [2]\n"
    ));
    assert!(
        two_schedules.contains("exactly one of at_s"),
        "{two_schedules}"
    );
    let bad_toml = scenario_error("iterations = \n");
    assert!(!bad_toml.is_empty());
}

#[tokio::test]
async fn a_target_that_does_not_answer_is_a_target_error() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody.sock");
    let scenario = parse(&format!(
        "iterations = 1\n[target]\nkind = \"socket\"\npath = {:?}\n[[op]]\nkind = \"checkpoint\"\n",
        socket.to_str().unwrap()
    ))
    .unwrap();
    match loadtest::run(&scenario).await {
        Err(LoadtestError::Target(message)) => {
            assert!(message.contains("does not answer"), "{message}")
        }
        other => panic!("expected a target error, got {other:?}"),
    }
    let http = parse(
        "iterations = 1\n[target]\nkind = \"http\"\nurl = \"http://127.0.0.1:9\"\n[[op]]\nkind = \"checkpoint\"\n",
    )
    .unwrap();
    assert!(matches!(
        loadtest::run(&http).await,
        Err(LoadtestError::Target(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_detector_catches_state_that_went_back_without_the_engine_saying_so() {
    // The operation itself takes the counter back once it reaches 3: a loss that no fault
    // and no recovery explains, in the fourth operation.
    let scenario = parse(
        "iterations = 6\n[target]\nkind = \"embedded\"\n\
         [[op]]\nkind = \"execute\"\ncode = \"if __lt_n >= 3:\\n    __lt_n -= 3\"\n",
    )
    .unwrap();
    let report = loadtest::run(&scenario).await.unwrap();
    assert_eq!(report.wrong_answers, 0, "{}", report.text());
    assert_eq!(report.lost_state.len(), 1, "{}", report.text());
    let lost = &report.lost_state[0];
    assert_eq!((lost.expected, lost.found), (3, 0));
    assert_eq!(lost.reported_lost, 0);
    assert_eq!(lost.after_fault, None);
    assert!(!report.passed());
    assert!(report.text().contains("LOST STATE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_of_a_fixed_sleep_adds_up() {
    let scenario = parse(
        "iterations = 5\nclients = 1\n[target]\nkind = \"embedded\"\n\
         [[op]]\nkind = \"execute\"\ncode = \"import time\\ntime.sleep(0.2)\"\n",
    )
    .unwrap();
    let report = loadtest::run(&scenario).await.unwrap();
    assert!(report.passed(), "{}", report.text());
    let sleep = &report.ops["execute"];
    assert_eq!(sleep.count, 5);
    assert_eq!(sleep.errors, 0);
    assert!(sleep.p50_ms >= 200.0, "{sleep:?}");
    assert!(sleep.p50_ms <= sleep.p95_ms && sleep.p95_ms <= sleep.p99_ms);
    assert!(sleep.p99_ms <= sleep.max_ms);
    assert!(sleep.max_ms < 30_000.0, "{sleep:?}");
    assert_eq!(report.ops[COUNTER].count, 5);
    assert_eq!(report.total_ops, 10);
    // Throughput is count over the run's length, and five 0.2 s sleeps take at least 1 s.
    let expected = 5.0 / report.duration_s;
    assert!((sleep.throughput_per_s - expected).abs() < 1e-9 * expected);
    assert!(report.duration_s >= 1.0);
    assert!((report.throughput_per_s - 10.0 / report.duration_s).abs() < 1e-9);
    assert!(report.resources.engine_peak_rss_mb.is_some());
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["ops"]["execute"]["count"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_smoke_scenario_passes_with_its_faults_recovered() {
    let scenario = Scenario::from_file(&examples().join("smoke.toml")).unwrap();
    let report = loadtest::run(&scenario).await.unwrap();
    let text = report.text();
    assert_eq!(report.wrong_answers, 0, "{text}");
    assert!(report.lost_state.is_empty(), "{text}");
    assert!(report.faults.len() >= 4, "{text}");
    assert_eq!(report.faults_unrecovered, 0, "{text}");
    assert!(report.crashes >= 1, "{text}");
    assert!(report.ops[COUNTER].count > 20, "{text}");
    assert!(report.passed(), "{text}");
}

#[test]
fn every_example_scenario_parses() {
    for name in ["smoke", "chaos", "soak", "replay", "cluster"] {
        let path = examples().join(format!("{name}.toml"));
        if let Err(err) = Scenario::from_file(&path) {
            panic!("{}: {err}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_run_survives_clients_that_stop_reading_or_vanish() {
    let daemon = Daemon::start().await;
    let scenario = parse(&format!(
        "duration_s = 8\nclients = 2\n[target]\nkind = \"socket\"\npath = {:?}\n\
         [[op]]\nkind = \"execute\"\ncode = \"x = 1\"\n\
         [[op]]\nkind = \"input\"\n\
         [[fault]]\nkind = \"slow_client\"\nat_s = [1]\nfor_s = 2\n\
         [[fault]]\nkind = \"vanished_client\"\nat_s = [2]\n\
         [[fault]]\nkind = \"kill_worker\"\nat_s = [3]\n",
        daemon.socket.to_str().unwrap()
    ))
    .unwrap();
    let report = loadtest::run(&scenario).await.unwrap();
    let text = report.text();
    assert!(report.passed(), "{text}");
    assert_eq!(report.faults.len(), 3, "{text}");
    assert!(report.ops["input"].count > 0, "{text}");
    // The daemon is another process: its memory is its own.
    assert!(!report.resources.engine_is_harness);
    assert!(report.resources.engine_peak_rss_mb.is_some(), "{text}");
    assert!(
        report.resources.workers_peak_rss_mb.unwrap() > 0.0,
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_come_back_whole_after_the_daemon_is_killed_and_restarted() {
    let scenario = parse(&format!(
        "duration_s = 8\nclients = 2\n[target]\nkind = \"daemon\"\nbinary = {:?}\n\
         durability = \"reply\"\n\
         [[op]]\nkind = \"execute\"\ncode = \"x = 1\"\n\
         [[fault]]\nkind = \"kill_daemon\"\nat_s = [3]\n\
         [[fault]]\nkind = \"cpu_spinner\"\nseconds = 60\nat_s = [1]\n",
        env!("CARGO_BIN_EXE_pyvisor")
    ))
    .unwrap();
    let report = loadtest::run(&scenario).await.unwrap();
    let text = report.text();
    assert!(report.passed(), "{text}");
    let [spinner, killed] = &report.faults[..] else {
        panic!("two faults: {text}")
    };
    assert!(killed.recovered, "{text}");
    assert!(killed.detail.contains("2 of 2 sessions back"), "{text}");
    // The spinner's own unnamed session died with the daemon: the report says so, and does
    // not count it as a fault the engine failed to recover from.
    assert!(spinner.cut_by_restart && !spinner.recovered, "{text}");
    assert_eq!(report.faults_cut_by_restart, 1, "{text}");
    assert_eq!(report.faults_unrecovered, 0, "{text}");
    // Each client checked its counter after the restart too: nothing lost, with reply
    // durability, although the daemon died without a word.
    assert!(report.ops[COUNTER].count > 20, "{text}");
    assert!(report.lost_state.is_empty(), "{text}");
}

/// The cluster target: the harness starts a throwaway PostgreSQL and two nodes, spreads the
/// clients' sessions over them, and SIGKILLs the node holding the most; with reply durability
/// each of its sessions answers again on the other node with nothing lost, and the node is
/// started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_sessions_answer_again_on_another_with_nothing_lost() {
    a_node_killed_under_load_loses_nothing_unadmitted("reply").await;
}

/// With debounced durability, a killed node's sessions lose what ran since its last upload:
/// counted in `lost_executions`, or, beyond that lower bound, acknowledged after the dead
/// node's last heartbeat (docs/cluster.md#failover). Nothing else goes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_debounced_durability_a_killed_nodes_losses_stay_within_the_documented_bound() {
    a_node_killed_under_load_loses_nothing_unadmitted("debounced").await;
}

/// Runs 8 s of 4 clients against two nodes the harness starts with `durability`, one of them
/// SIGKILLed after 3 s and started again 2 s later: no wrong answer, no loss beyond what the
/// mode allows, each of the killed node's sessions answered again on the other node.
async fn a_node_killed_under_load_loses_nothing_unadmitted(durability: &str) {
    let scenario = parse(&format!(
        "duration_s = 8\nclients = 4\n[target]\nkind = \"cluster\"\nnodes = 2\n\
         binary = {:?}\nlease_ttl_s = 1\ndurability = \"{durability}\"\n\
         [[op]]\nkind = \"execute\"\ncode = \"x = 1\"\n[[op]]\nkind = \"checkpoint\"\n\
         [[fault]]\nkind = \"node_kill\"\nat_s = [3]\nfor_s = 2\n",
        env!("CARGO_BIN_EXE_pyvisor")
    ))
    .unwrap();
    let report = loadtest::run(&scenario).await.expect("the cluster starts");
    let text = report.text();
    assert!(report.passed(), "{text}");
    assert_eq!(report.wrong_answers, 0, "{text}");
    assert!(report.lost_state.is_empty(), "{text}");
    if durability == "reply" {
        assert_eq!(report.lost_uncounted, 0, "{text}");
    }
    let [kill] = &report.faults[..] else {
        panic!("one fault: {text}")
    };
    assert_eq!(kill.kind, "node_kill", "{text}");
    // Four sessions spread over two nodes: the one killed held at least two, and each
    // answered again (on the other node) before the run ended; the node came back.
    assert!(kill.recovered, "{text}");
    assert!(kill.failover_gaps_s.len() >= 2, "{text}");
    assert!(kill.detail.contains("restarted after"), "{text}");
    let failover = report
        .failover
        .as_ref()
        .expect("a cluster run reports failover");
    assert_eq!(failover.node_kills, 1, "{text}");
    assert_eq!(
        failover.sessions as usize,
        kill.failover_gaps_s.len(),
        "{text}"
    );
    // The clients went on checking their counters after the kill.
    assert!(report.ops[COUNTER].count > 20, "{text}");
    // Both nodes' processes were sampled, the restarted one as a new process.
    let resources = &report.resources;
    assert_eq!(resources.engine_processes, 2, "{text}");
    assert!(resources.engine_peak_rss_mb.unwrap() > 1.0, "{text}");
    assert!(resources.workers_peak_rss_mb.unwrap() > 1.0, "{text}");
    assert!(text.contains("the largest of 2 nodes"), "{text}");
}

/// The cluster target given by URLs: a cluster that runs already (two nodes on one real
/// PostgreSQL, started here), which the harness drives without starting anything, each
/// session's calls going back to the node that created it; `node_kill` needs a cluster the
/// harness runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_cluster_given_by_its_urls_is_driven_as_it_is() {
    let db = common::postgres::database().await;
    let homes = tempfile::tempdir().expect("temp dir");
    let (mut nodes, mut ports) = (Vec::new(), Vec::new());
    for id in ["node-a", "node-b"] {
        let home = homes.path().join(id);
        let port = crate::cluster::free_port();
        let addr = format!("127.0.0.1:{port}");
        let config =
            crate::cluster::advertised_node_config(&home, &db, id, &format!("http://{addr}"));
        let args = ["--config", config.to_str().unwrap(), "--http", &addr];
        nodes.push(Daemon::start_in(&home, &args, &[]).await);
        ports.push(port);
    }
    let urls: Vec<String> = ports
        .iter()
        .map(|port| format!("http://127.0.0.1:{port}"))
        .collect();
    let target = format!("[target]\nkind = \"cluster\"\nurls = {urls:?}\n");
    let scenario = parse(&format!(
        "duration_s = 4\nclients = 4\n{target}[[op]]\nkind = \"execute\"\ncode = \"x = 1\"\n"
    ))
    .unwrap();
    let report = loadtest::run(&scenario).await.expect("the cluster answers");
    let text = report.text();
    assert!(report.passed(), "{text}");
    assert!(text.contains("cluster at http://127.0.0.1:"), "{text}");
    assert!(report.ops[COUNTER].count > 10, "{text}");
    // Four sessions spread over the two nodes, each run where it was made: neither node
    // forwarded a call.
    for port in ports {
        let (_, metrics) = common::http_get(port, "/metrics", None).await;
        let ran = crate::cluster::metric(&metrics, r#"pyvisor_executions_total{status="ok"}"#);
        assert!(ran > 10.0, "{metrics}");
        let forwarded = crate::cluster::metric(&metrics, "pyvisor_cluster_forwarded_total");
        assert_eq!(forwarded, 0.0, "{metrics}");
    }

    let killing = scenario_error(&format!(
        "duration_s = 4\n{target}[[op]]\nkind = \"execute\"\ncode = \"x = 1\"\n\
         [[fault]]\nkind = \"node_kill\"\nat_s = [1]\n"
    ));
    assert!(killing.contains("no urls"), "{killing}");
}

#[test]
fn the_command_writes_json_compares_and_says_so_in_its_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("tiny.toml");
    std::fs::write(
        &scenario,
        "iterations = 3\n[target]\nkind = \"embedded\"\n[[op]]\nkind = \"execute\"\ncode = \"x = 1\"\n",
    )
    .unwrap();
    let json = dir.path().join("report.json");
    let pyvisor = || Command::new(env!("CARGO_BIN_EXE_pyvisor"));
    let first = pyvisor()
        .arg("loadtest")
        .arg(&scenario)
        .arg("--json")
        .arg(&json)
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert_eq!(
        first.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(stdout.contains(COUNTER), "{stdout}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["ops"]["execute"]["count"], 3);

    // A baseline ten thousand times faster: every latency is far past the threshold.
    let mut fast = report.clone();
    for op in fast["ops"].as_object_mut().unwrap().values_mut() {
        for figure in ["p50_ms", "p95_ms", "p99_ms", "max_ms"] {
            op[figure] = serde_json::json!(op[figure].as_f64().unwrap() / 10_000.0);
        }
    }
    let base = dir.path().join("base.json");
    std::fs::write(&base, fast.to_string()).unwrap();
    let compared = pyvisor()
        .arg("loadtest")
        .arg(&scenario)
        .arg("--compare")
        .arg(&base)
        .arg("--threshold")
        .arg("1.5")
        .env("HOME", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&compared.stdout);
    assert_eq!(compared.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("ops.execute.p50_ms"), "{stdout}");
    assert!(stdout.contains("WORSE"), "{stdout}");

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "iterations = 1\n[target]\nkind = \"embedded\"\n[[op]]\nkind = \"nope\"\n",
    )
    .unwrap();
    let refused = pyvisor().arg("loadtest").arg(&bad).output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("op[0].kind"));
}
