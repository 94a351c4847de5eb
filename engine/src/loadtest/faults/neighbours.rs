//! The faults that come from noisy neighbours of the clients: a session of the fault's own
//! running the fault's code, or a socket client that stops reading or vanishes mid-stream.
//! Everyone else must keep being served.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::{FaultKind, FaultSpec};
use crate::loadtest::ops::status_kind;
use crate::loadtest::target::Target;

/// Runs `code` in a new session with a timeout of `timeout_s`; the session and what came of it.
pub(super) async fn own_session(
    target: &Target,
    code: &str,
    timeout_s: f64,
) -> Result<(String, String), String> {
    let session = target.create(None, None).await?;
    let detail = match target
        .execute(&session, code, Duration::from_secs_f64(timeout_s))
        .await
    {
        Ok(result) => {
            let mut detail = status_kind(&result);
            if let Some(value) = &result.result {
                detail.push_str(&format!(" = {}", value.repr));
            }
            detail.push_str(&format!(", {} bytes of stdout", result.stdout.len()));
            detail
        }
        Err(kind) => kind,
    };
    Ok((session, detail))
}

/// A client on its own connection that asks for a large streamed output, then stops reading
/// (`slow_client`) or disconnects at once (`vanished_client`).
pub(super) async fn raw_client(
    spec: &FaultSpec,
    target: &Target,
) -> Result<(String, String), String> {
    let path = target.socket_path().ok_or("no socket")?;
    let session = target.create(None, None).await?;
    let mut stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|err| format!("connect: {err}"))?;
    let request = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "session.execute",
        "params": {"session_id": session, "stream": true,
                   "code": "for i in range(2_000_000):\n    print('flood', i)"}
    });
    let mut line = request.to_string();
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .await
        .map_err(|err| format!("write: {err}"))?;
    let detail = if spec.kind == FaultKind::SlowClient {
        let pause = Duration::from_secs_f64(spec.for_s.unwrap_or(5.0));
        tokio::time::sleep(pause).await;
        format!("a client that did not read for {pause:?}")
    } else {
        tokio::time::sleep(Duration::from_millis(200)).await;
        "a client that disconnected mid-stream".to_owned()
    };
    drop(stream);
    // The flood goes on without its reader: stop it so that the session answers again.
    let _ = target.interrupt(&session).await;
    Ok((session, detail))
}
