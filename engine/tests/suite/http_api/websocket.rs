//! The WebSocket route of docs/protocol.md (HTTP): output streamed in order before the
//! response, `input()` answered on the same socket, a message over the limit, and a stop that
//! lets a running execution finish before it closes the socket.

use awc::error::WsProtocolError;
use awc::ws;
use futures::{Sink, SinkExt};

use super::*;

/// A connected WebSocket client.
trait Socket:
    Stream<Item = Result<ws::Frame, WsProtocolError>>
    + Sink<ws::Message, Error = WsProtocolError>
    + Unpin
{
}

impl<T> Socket for T where
    T: Stream<Item = Result<ws::Frame, WsProtocolError>>
        + Sink<ws::Message, Error = WsProtocolError>
        + Unpin
{
}

async fn connect(server: &Server, id: &str) -> impl Socket {
    let (_, socket) = server
        .client()
        .ws(server.ws_url(&format!("/v1/sessions/{id}/ws")))
        .max_frame_size(4 * MAX_REQUEST_BYTES)
        .connect()
        .await
        .expect("the WebSocket connects");
    socket
}

async fn send(socket: &mut impl Socket, message: Value) {
    socket
        .send(ws::Message::Text(message.to_string().into()))
        .await
        .expect("the message is sent");
}

/// The next JSON text message; answers pings on the way.
async fn receive(socket: &mut impl Socket) -> Value {
    loop {
        let frame = actix_rt::time::timeout(Duration::from_secs(60), socket.next())
            .await
            .expect("a message within 60 s")
            .expect("the socket is open")
            .expect("a valid frame");
        match frame {
            ws::Frame::Text(text) => return serde_json::from_slice(&text).expect("JSON"),
            ws::Frame::Ping(bytes) => {
                let _ = socket.send(ws::Message::Pong(bytes)).await;
            }
            other => panic!("unexpected frame {other:?}"),
        }
    }
}

/// Waits (up to 10 s) for the server's close frame, and checks its code.
async fn assert_closed_with(socket: &mut impl Socket, code: ws::CloseCode) {
    let closed = actix_rt::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .expect("the socket closes");
    assert!(
        matches!(closed, Some(Ok(ws::Frame::Close(Some(ref reason)))) if reason.code == code),
        "{closed:?}, not a close with {code:?}"
    );
}

#[actix_rt::test]
async fn websocket_streams_output_in_order_before_the_response() {
    let server = start().await;
    let id = server.create().await;
    let mut socket = connect(&server, &id).await;
    send(
        &mut socket,
        json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute", "params": {
            "session_id": id, "code": "for i in range(5): print(i, flush=True)", "stream": true}}),
    )
    .await;
    let mut streamed = String::new();
    let response = loop {
        let message = receive(&mut socket).await;
        if message["id"] == 1 {
            break message;
        }
        assert_eq!(message["method"], "session.output", "{message}");
        assert_eq!(message["params"]["stream"], "stdout");
        streamed.push_str(message["params"]["data"].as_str().expect("data"));
    };
    assert_eq!(streamed, "0\n1\n2\n3\n4\n");
    assert_eq!(
        response["result"]["stdout"], "0\n1\n2\n3\n4\n",
        "{response}"
    );

    socket
        .send(ws::Message::Ping("are you there".into()))
        .await
        .expect("a ping is sent");
    let pong = actix_rt::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .expect("a pong in time")
        .expect("the socket is open")
        .expect("a valid frame");
    assert_eq!(pong, ws::Frame::Pong("are you there".into()));

    socket
        .send(ws::Message::Close(None))
        .await
        .expect("close is sent");
    let closed = actix_rt::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .expect("the close is answered");
    assert!(
        matches!(closed, Some(Ok(ws::Frame::Close(_)))),
        "{closed:?}"
    );
    server.stop().await;
}

#[actix_rt::test]
async fn websocket_answers_input_on_the_same_socket() {
    let server = start().await;
    let id = server.create().await;
    let mut socket = connect(&server, &id).await;
    send(
        &mut socket,
        json!({"jsonrpc": "2.0", "id": "run", "method": "session.execute", "params": {
            "session_id": id, "code": "name = input('who? ')\nprint('hi', name)",
            "stream": true}}),
    )
    .await;
    let request = loop {
        let message = receive(&mut socket).await;
        if message["method"] == "session.input_request" {
            break message;
        }
        assert_ne!(message["id"], "run", "finished without asking: {message}");
    };
    assert_eq!(request["params"]["prompt"], "who? ");
    let execution_id = request["params"]["execution_id"].clone();
    send(
        &mut socket,
        json!({"jsonrpc": "2.0", "id": "answer", "method": "session.input", "params": {
            "session_id": id, "execution_id": execution_id, "value": "ada"}}),
    )
    .await;
    let mut answered = false;
    let result = loop {
        let message = receive(&mut socket).await;
        if message["id"] == "answer" {
            assert_eq!(message["result"], json!({}), "{message}");
            answered = true;
        } else if message["id"] == "run" {
            break message;
        }
    };
    assert!(
        answered,
        "session.input got no response before the execution ended"
    );
    let stdout = result["result"]["stdout"].as_str().expect("stdout");
    assert!(stdout.contains("hi ada"), "{result}");
    server.stop().await;
}

#[actix_rt::test]
async fn websocket_message_over_the_limit_gets_an_error_and_a_close() {
    let server = start().await;
    let id = server.create().await;
    let mut socket = connect(&server, &id).await;
    let code = "a".repeat(MAX_REQUEST_BYTES + 1);
    send(
        &mut socket,
        json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute",
               "params": {"session_id": id, "code": code}}),
    )
    .await;
    let error = receive(&mut socket).await;
    assert_eq!(error["error"]["code"], -32600, "{error}");
    assert_closed_with(&mut socket, ws::CloseCode::Size).await;
    server.stop().await;
}

#[actix_rt::test]
async fn stop_closes_websockets_and_releases_the_port() {
    let server = start().await;
    // The path must name a live session: a WebSocket is pinned to it.
    let id = server.create().await;
    let mut socket = connect(&server, &id).await;
    let addr = server.http.local_addr();
    let engine = server.engine.clone();
    server.stop().await;
    assert_closed_with(&mut socket, ws::CloseCode::Away).await;
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still listening"
    );
    drop(engine);
}

#[actix_rt::test]
async fn stop_lets_a_websocket_execution_finish_then_closes_the_socket() {
    let server = start().await;
    let id = server.create().await;
    let mut socket = connect(&server, &id).await;
    send(
        &mut socket,
        json!({"jsonrpc": "2.0", "id": 1, "method": "session.execute", "params": {
            "session_id": id, "code": "import time\ntime.sleep(1)\n'done'"}}),
    )
    .await;
    wait_until_busy(&server, &id).await;
    let stopping = actix_rt::spawn(server.http.stop(Duration::from_secs(30)));
    let response = receive(&mut socket).await;
    assert_eq!(response["id"], 1, "{response}");
    assert_eq!(response["result"]["result"]["repr"], "'done'", "{response}");
    assert_closed_with(&mut socket, ws::CloseCode::Away).await;
    stopping.await.expect("stop completes");
}
