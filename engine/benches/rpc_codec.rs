//! What the daemon's JSON work costs per request, beside the round trips of the daemon bench:
//! reading a `session.execute` line as the socket does (the strict parse that refuses
//! duplicate keys, then the typed params) and writing its reply (the result as a raw value in
//! the response envelope). Issue 13 asked for params parsed once and replies written once;
//! these figures say what that could save.
//!
//! Run: `cargo bench -p pyvisor --bench rpc_codec`.

use std::hint::black_box;
use std::time::Instant;

use pyvisor::rpc::strict_json::{parse_message, Message};
use pyvisor::rpc::wire::ExecuteParams;
use serde_json::Value;

const ROUNDS: u32 = 200_000;

/// The response envelope, as the daemon writes it.
#[derive(serde::Serialize)]
struct Reply {
    jsonrpc: &'static str,
    result: Box<serde_json::value::RawValue>,
    id: Value,
}

/// Microseconds per call of `step`, over [`ROUNDS`] calls.
fn per_call(mut step: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..ROUNDS {
        step();
    }
    start.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("rpc_codec: bench");
        return;
    }
    let line = br#"{"jsonrpc":"2.0","id":17,"method":"session.execute","params":{"session_id":"s-3f9a2b-1","code":"x = 1"}}"#;
    let read = per_call(|| {
        let Ok(Message::Object(request)) = parse_message(line) else {
            panic!("a request object");
        };
        let Value::Object(mut request) = request.value else {
            panic!("an object");
        };
        let params = request.remove("params").expect("params");
        let params: ExecuteParams = serde_json::from_value(params).expect("execute params");
        black_box(params);
    });
    let result = serde_json::json!({
        "execution_id": "e-17", "execution_count": 17, "status": "ok", "stdout": "",
        "stderr": "", "result": null, "display": [], "error": null, "duration_ms": 0.21,
        "from_cache": false, "insights": [], "warnings": [], "recovered": null
    });
    let write = per_call(|| {
        let reply = Reply {
            jsonrpc: "2.0",
            result: serde_json::value::to_raw_value(&result).expect("a plain value"),
            id: Value::from(17),
        };
        black_box(serde_json::to_string(&reply).expect("a plain value"));
    });
    println!("read a session.execute request (strict parse, typed params): {read:.2} µs");
    println!("write its reply (result, envelope):                          {write:.2} µs");
}
