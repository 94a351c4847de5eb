//! The memory's API over the wire: `memory.*` JSON-RPC methods and `session.execute` `meta`
//! on a real daemon's socket, with real Python workers. The `/v1/memory` HTTP routes and the
//! memory metrics are tested in `engine/tests/memory_metrics.rs`, a binary of its own: the
//! metrics recorder is process-wide.

use crate::common;

use common::{Conn, Daemon};
use serde_json::{json, Value};

const SETUP: &str = "import pandas as pd\ndf = pd.DataFrame({'a': [1.0, None, 3.0]})";
const FAILING: &str = "df = df.fillna(method='ffill')";
const FIX: &str = "df = df.ffill()";

async fn create(conn: &mut Conn, owner: &str) -> String {
    let created = conn.call("session.create", json!({"owner": owner})).await;
    created["session_id"].as_str().expect("an id").to_owned()
}

async fn execute(conn: &mut Conn, id: &str, code: &str, meta: Value) -> Value {
    conn.call(
        "session.execute",
        json!({"session_id": id, "code": code, "meta": meta}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_methods_on_the_socket() {
    let daemon = Daemon::start().await;
    let mut conn = daemon.connect().await;
    for _ in 0..2 {
        let id = create(&mut conn, "alice").await;
        execute(&mut conn, &id, SETUP, Value::Null).await;
        let failed = execute(
            &mut conn,
            &id,
            FAILING,
            json!({"approach": "fillna with method"}),
        )
        .await;
        assert_eq!(failed["status"], "error", "{failed}");
        assert_eq!(
            failed["insights"],
            json!([]),
            "insights are always there: {failed}"
        );
        let meta = json!({"approach": "ffill()", "task": "fill gaps", "tags": ["pandas"]});
        let fixed = execute(&mut conn, &id, FIX, meta).await;
        assert_eq!(fixed["status"], "ok", "{fixed}");
    }
    let id = create(&mut conn, "alice").await;
    // Before running: the check by session and by owner.
    let by_session = conn
        .call("memory.check", json!({"session_id": id, "code": FAILING}))
        .await;
    let insights = by_session["insights"].as_array().expect("insights");
    assert_eq!(insights.len(), 1, "{by_session}");
    let suggestion = insights[0]["suggestion"].as_str().unwrap_or_default();
    assert!(
        suggestion.contains("ffill()"),
        "the approach that worked: {by_session}"
    );
    let by_owner = conn
        .call("memory.check", json!({"owner": "bob", "code": FAILING}))
        .await;
    assert_eq!(by_owner["insights"], json!([]), "{by_owner}");

    execute(&mut conn, &id, SETUP, Value::Null).await;
    let repeated = execute(&mut conn, &id, FAILING, Value::Null).await;
    let insight = &repeated["insights"][0];
    assert_eq!(insight["kind"], "failure_pattern", "{repeated}");
    let insight_id = insight["id"].as_str().expect("an id").to_owned();

    // Bad params name their field.
    let bad_score = conn
        .try_call(
            "memory.feedback",
            json!({"insight_id": insight_id, "score": 5}),
        )
        .await
        .unwrap();
    assert_eq!(bad_score["error"]["code"], -32602, "{bad_score}");
    assert!(bad_score["error"]["message"]
        .as_str()
        .unwrap()
        .contains("score"));
    let unknown = conn
        .try_call(
            "memory.feedback",
            json!({"insight_id": "i-999999", "score": -1}),
        )
        .await
        .unwrap();
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");
    assert!(unknown["error"]["message"]
        .as_str()
        .unwrap()
        .contains("insight_id"));
    let both = conn
        .error_code(
            "memory.feedback",
            json!({"insight_id": insight_id, "outcome_id": "m-1", "score": 1}),
        )
        .await;
    assert_eq!(both, -32602);
    let ok = conn
        .call(
            "memory.feedback",
            json!({"insight_id": insight_id, "score": 1, "comment": "yes"}),
        )
        .await;
    assert_eq!(ok, json!({}));

    let found = conn
        .call(
            "memory.search",
            json!({"owner": "alice", "query": FAILING, "limit": 3}),
        )
        .await;
    let found = found.as_array().expect("a list of outcomes");
    assert_eq!(found.len(), 3);
    assert_eq!(found[0]["owner"], "alice");
    assert!(found[0]["error"]["type"] == "TypeError", "{found:?}");
    let none = conn
        .call("memory.search", json!({"owner": "bob", "query": FAILING}))
        .await;
    assert_eq!(none, json!([]));

    let stats = conn.call("memory.stats", json!({"owner": "alice"})).await;
    assert_eq!(stats["enabled"], true, "{stats}");
    assert_eq!(stats["interruptions"], 1, "{stats}");
    assert_eq!(stats["failing_executions"], 3, "{stats}");
    assert_eq!(stats["feedback"]["helpful"], 1, "{stats}");
    let engine_stats = conn.call("engine.stats", json!({})).await;
    assert_eq!(engine_stats["memory"]["interruptions"], 1, "{engine_stats}");
}
