//! The REST routes of SPEC.md §3 under `/v1`. Each route turns its path, query and body into
//! the params of one JSON-RPC method and answers with that method's result, so HTTP and
//! JSON-RPC behave alike. A POST body is the method's params without `session_id` (the path
//! gives it). Plain HTTP has nowhere to send notifications: an execution's output arrives
//! whole in its result and `input()` raises `EOFError`; the WebSocket route streams both.

use actix_web::http::header::ContentType;
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{ws, ApiError, State};
use crate::rpc::wire::{method, Created, ListParams};
use crate::rpc::{code, Outbound, RpcError};

/// Registers the `/v1` routes.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config.service(
        web::scope("/v1")
            .route("/sessions", web::post().to(create))
            .route("/sessions", web::get().to(list))
            .route("/sessions/{id}", web::get().to(info))
            .route("/sessions/{id}", web::delete().to(close))
            .route("/sessions/{id}/execute", web::post().to(execute))
            .route("/sessions/{id}/input", web::post().to(input))
            .route("/sessions/{id}/interrupt", web::post().to(interrupt))
            .route("/sessions/{id}/checkpoint", web::post().to(checkpoint))
            .route("/sessions/{id}/restore", web::post().to(restore))
            .route("/sessions/{id}/checkpoints", web::get().to(checkpoints))
            .route("/sessions/{id}/hint", web::post().to(hint))
            .route("/sessions/{id}/ws", web::get().to(ws::connect))
            .route("/stats", web::get().to(stats))
            .route("/health", web::get().to(health)),
    );
}

/// The query of `DELETE /v1/sessions/{id}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseQuery {
    #[serde(default)]
    checkpoint: bool,
}

/// `POST /v1/sessions`: 201 with a new session, 200 when `name` attached to a live one.
async fn create(state: web::Data<State>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let params = body_object(body, state.max_request_bytes).await?;
    let created = call(&state, method::CREATE, Value::Object(params)).await?;
    let attached = serde_json::from_str::<Created>(created.get())
        .map(|created| created.attached)
        .unwrap_or(false);
    let mut response = if attached {
        HttpResponse::Ok()
    } else {
        HttpResponse::Created()
    };
    Ok(json_body(&mut response, created))
}

/// `GET /v1/sessions[?owner=]`.
async fn list(state: web::Data<State>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let params: ListParams = query(&req)?;
    let params = serde_json::to_value(params).expect("list params are plain JSON");
    respond(call(&state, method::LIST, params).await)
}

/// `GET /v1/sessions/{id}`.
async fn info(state: web::Data<State>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    respond(call(&state, method::INFO, session_only(id)).await)
}

/// `DELETE /v1/sessions/{id}[?checkpoint=true]`.
async fn close(
    state: web::Data<State>,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let CloseQuery { checkpoint } = query(&req)?;
    let params = serde_json::json!({"session_id": id.into_inner(), "checkpoint": checkpoint});
    respond(call(&state, method::CLOSE, params).await)
}

/// `POST /v1/sessions/{id}/execute`: the result, whatever the code's status.
async fn execute(
    state: web::Data<State>,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, method::EXECUTE, id, body).await
}

/// `POST /v1/sessions/{id}/input` with `{execution_id, value}`.
async fn input(
    state: web::Data<State>,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, method::INPUT, id, body).await
}

/// `POST /v1/sessions/{id}/interrupt`.
async fn interrupt(
    state: web::Data<State>,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, method::INTERRUPT, id, body).await
}

/// `POST /v1/sessions/{id}/checkpoint`.
async fn checkpoint(
    state: web::Data<State>,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, method::CHECKPOINT, id, body).await
}

/// `POST /v1/sessions/{id}/restore` with `{checkpoint_id?}`.
async fn restore(
    state: web::Data<State>,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, method::RESTORE, id, body).await
}

/// `POST /v1/sessions/{id}/hint` with `{code: [..]}`.
async fn hint(
    state: web::Data<State>,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, method::HINT, id, body).await
}

/// `GET /v1/sessions/{id}/checkpoints`: newest first.
async fn checkpoints(
    state: web::Data<State>,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    respond(call(&state, method::CHECKPOINTS, session_only(id)).await)
}

/// `GET /v1/stats`: `engine.stats`.
async fn stats(state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    respond(call(&state, method::STATS, Value::Null).await)
}

/// `GET /v1/health`: `engine.health`.
async fn health(state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    respond(call(&state, method::HEALTH, Value::Null).await)
}

/// Runs `method` of session `id` with the body's params.
async fn with_body(
    state: &State,
    method: &str,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let mut params = body_object(body, state.max_request_bytes).await?;
    let id = id.into_inner();
    match params.get("session_id") {
        None => {}
        Some(Value::String(given)) if *given == id => {}
        Some(_) => {
            return Err(RpcError::invalid_params(
                "session_id: differs from the session in the path",
            )
            .into())
        }
    }
    params.insert("session_id".into(), Value::String(id));
    respond(call(state, method, Value::Object(params)).await)
}

/// Runs `method` on the dispatcher. Notifications have no reader here and are dropped.
async fn call(state: &State, method: &str, params: Value) -> Result<Box<RawValue>, ApiError> {
    let params = (!params.is_null()).then_some(params);
    Ok(state
        .dispatcher
        .call(method, params, &Outbound::closed())
        .await?)
}

/// 200 with the method's result.
fn respond(result: Result<Box<RawValue>, ApiError>) -> Result<HttpResponse, ApiError> {
    result.map(|value| json_body(&mut HttpResponse::Ok(), value))
}

/// A response whose body is the method's result, already JSON text.
fn json_body(response: &mut HttpResponseBuilder, value: Box<RawValue>) -> HttpResponse {
    response
        .content_type(ContentType::json())
        .body(Box::<str>::from(value).into_string())
}

/// Params that only name the session of the path.
fn session_only(id: web::Path<String>) -> Value {
    serde_json::json!({"session_id": id.into_inner()})
}

/// The request's query string decoded as `T`.
fn query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|err| RpcError::invalid_params(format!("query: {err}")).into())
}

/// The body as a JSON object: none is `{}`, more than `limit` bytes is "limit exceeded".
async fn body_object(body: web::Payload, limit: usize) -> Result<Map<String, Value>, ApiError> {
    let bytes = match body.to_bytes_limited(limit).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(err)) => {
            return Err(RpcError::invalid_request(format!("unreadable body: {err}")).into())
        }
        Err(_) => {
            return Err(RpcError::new(
                code::LIMIT_EXCEEDED,
                format!(
                    "limit exceeded: the body is longer than server.max_request_bytes \
                     ({limit} bytes)"
                ),
            )
            .into())
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(params)) => Ok(params),
        Ok(_) => Err(RpcError::invalid_params("the body must be a JSON object").into()),
        Err(err) => Err(RpcError::parse_error(err).into()),
    }
}
