//! The REST routes of docs/protocol.md (HTTP) under `/v1`. Each route turns its path, query and body into
//! the params of one JSON-RPC method and answers with that method's result, so HTTP and
//! JSON-RPC behave alike. A POST body is the method's params without `session_id` (the path
//! gives it). A plain HTTP response has nowhere to send notifications: an execution's output
//! arrives whole in its result and `input()` raises `EOFError`, unless the client asks for
//! the streamed response of `stream`; the WebSocket route streams both too.

use actix_web::http::header::ContentType;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{bridge, stream, ws, ApiError, State};
use crate::rpc::strict_json::{self, duplicate_message, ParamsError};
use crate::rpc::wire::{method, Created, ListParams};
use crate::rpc::{code, Caller, Outbound, RpcError};

/// Registers the `/v1` routes.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config.service(
        web::scope("/v1")
            .route("/sessions", web::post().to(create))
            .route("/sessions", web::get().to(list))
            .route("/sessions/{id}", web::get().to(info))
            .route("/sessions/{id}", web::delete().to(close))
            .route("/sessions/{id}/execute", web::post().to(stream::execute))
            .route("/sessions/{id}/input", post_method(method::INPUT))
            .route("/sessions/{id}/interrupt", post_method(method::INTERRUPT))
            .route("/sessions/{id}/checkpoint", post_method(method::CHECKPOINT))
            .route("/sessions/{id}/restore", post_method(method::RESTORE))
            .route("/sessions/{id}/checkpoints", web::get().to(checkpoints))
            .route("/sessions/{id}/hint", post_method(method::HINT))
            .route("/sessions/{id}/complete", post_method(method::COMPLETE))
            .route("/sessions/{id}/fork", post_method(method::FORK))
            .route("/sessions/{id}/ws", web::get().to(ws::connect))
            .route("/sessions/{id}/bridge", web::post().to(bridge::answer))
            .configure(super::files::configure)
            .configure(super::memory::configure)
            .configure(super::tasks::configure)
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
    owner: Option<String>,
}

/// The query of the GET routes of one session: the owner an admin acts for.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerQuery {
    owner: Option<String>,
}

/// The header that names a new session's id in the answer to `POST /v1/sessions`, so that a
/// load balancer can learn which node holds it (examples/cluster/haproxy.cfg).
pub const SESSION_HEADER: &str = "X-Pyvisor-Session";

/// `POST /v1/sessions`: 201 with a new session, 200 when `name` attached to a live one.
async fn create(
    state: web::Data<State>,
    caller: Caller,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let params = body_object(&state, body).await?;
    let created = call(&state, &caller, method::CREATE, Value::Object(params)).await?;
    let created_as = serde_json::from_str::<Created>(created.get()).ok();
    let mut response = match &created_as {
        Some(created) if created.attached => HttpResponse::Ok(),
        _ => HttpResponse::Created(),
    };
    if let Some(created) = created_as {
        response.insert_header((SESSION_HEADER, created.session_id));
    }
    Ok(json_body(&mut response, created))
}

/// `GET /v1/sessions[?owner=]`.
async fn list(
    state: web::Data<State>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let params: ListParams = query(&req)?;
    let params = serde_json::to_value(params).expect("list params are plain JSON");
    respond(call(&state, &caller, method::LIST, params).await)
}

/// `GET /v1/sessions/{id}[?owner=]`.
async fn info(
    state: web::Data<State>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    respond(call(&state, &caller, method::INFO, session_only(id, &req)?).await)
}

/// `DELETE /v1/sessions/{id}[?checkpoint=true][&owner=]`.
async fn close(
    state: web::Data<State>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let CloseQuery { checkpoint, owner } = query(&req)?;
    let mut params = serde_json::json!({"session_id": id.into_inner(), "checkpoint": checkpoint});
    if let Some(owner) = owner {
        params["owner"] = Value::String(owner);
    }
    respond(call(&state, &caller, method::CLOSE, params).await)
}

/// `GET /v1/sessions/{id}/checkpoints[?owner=]`: newest first.
async fn checkpoints(
    state: web::Data<State>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    respond(
        call(
            &state,
            &caller,
            method::CHECKPOINTS,
            session_only(id, &req)?,
        )
        .await,
    )
}

/// `GET /v1/stats`: `engine.stats`.
async fn stats(state: web::Data<State>, caller: Caller) -> Result<HttpResponse, ApiError> {
    respond(call(&state, &caller, method::STATS, Value::Null).await)
}

/// `GET /v1/health`: `engine.health`.
async fn health(state: web::Data<State>, caller: Caller) -> Result<HttpResponse, ApiError> {
    respond(call(&state, &caller, method::HEALTH, Value::Null).await)
}

/// `POST /v1/sessions/{id}/<name>`: the JSON-RPC `method` of that name with the body as its
/// params (`execute` answers 200 with the result, whatever the code's status; `input` takes
/// `{execution_id, value}`, `restore` `{checkpoint_id?}`, `hint` `{code: [..]}`, `complete`
/// `{code, cursor?}`).
fn post_method(method: &'static str) -> actix_web::Route {
    web::post().to(
        move |state: web::Data<State>,
              caller: Caller,
              id: web::Path<String>,
              body: web::Payload| async move {
            with_session_body(&state, &caller, method, id, body).await
        },
    )
}

/// Runs `method` of session `id` with the body's params.
async fn with_session_body(
    state: &State,
    caller: &Caller,
    method: &str,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let params = with_params(body_object(state, body).await?, id.into_inner())?;
    run(state, caller, method, params).await
}

/// A POST body's `params` with `session_id` the session `id` of the path (a `session_id` in
/// the body must be that one).
pub(super) fn with_params(
    mut params: Map<String, Value>,
    id: String,
) -> Result<Map<String, Value>, ApiError> {
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
    Ok(params)
}

/// 200 with the result of `method` with `params`.
pub(super) async fn run(
    state: &State,
    caller: &Caller,
    method: &str,
    params: Map<String, Value>,
) -> Result<HttpResponse, ApiError> {
    respond(call(state, caller, method, Value::Object(params)).await)
}

/// Runs `method` on the dispatcher for `caller`. Notifications have no reader here and are
/// dropped.
pub(super) async fn call(
    state: &State,
    caller: &Caller,
    method: &str,
    params: Value,
) -> Result<Box<RawValue>, ApiError> {
    let params = (!params.is_null()).then_some(params);
    Ok(state
        .dispatcher
        .call(caller, method, params, &Outbound::closed())
        .await?)
}

/// 200 with the method's result.
pub(super) fn respond(result: Result<Box<RawValue>, ApiError>) -> Result<HttpResponse, ApiError> {
    result.map(|value| json_body(&mut HttpResponse::Ok(), value))
}

/// A response whose body is the method's result, already JSON text.
fn json_body(response: &mut HttpResponseBuilder, value: Box<RawValue>) -> HttpResponse {
    response
        .content_type(ContentType::json())
        .body(Box::<str>::from(value).into_string())
}

/// Params that name the session of the path, and the owner of the query if it names one.
fn session_only(id: web::Path<String>, req: &HttpRequest) -> Result<Value, ApiError> {
    let OwnerQuery { owner } = query(req)?;
    let mut params = serde_json::json!({"session_id": id.into_inner()});
    if let Some(owner) = owner {
        params["owner"] = Value::String(owner);
    }
    Ok(params)
}

/// The request's query string decoded as `T`.
pub(super) fn query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .map_err(|err| RpcError::invalid_params(format!("query: {err}")).into())
}

/// Calls `method` with the body, a JSON object ([`body_object`]), as its params.
pub(super) async fn with_body(
    state: &State,
    caller: &Caller,
    method: &str,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    run(state, caller, method, body_object(state, body).await?).await
}

/// The body as a JSON object: none is `{}`, more than `server.max_request_bytes` is "limit
/// exceeded", a duplicate key is invalid params, and a body that takes longer than the
/// request timeout to arrive is cut off with 408.
pub(super) async fn body_object(
    state: &State,
    body: web::Payload,
) -> Result<Map<String, Value>, ApiError> {
    let limit = state.max_request_bytes;
    let timeout = state.access.request_timeout;
    let read = tokio::time::timeout(timeout, body.to_bytes_limited(limit)).await;
    let bytes = match read {
        Ok(Ok(Ok(bytes))) => bytes,
        Ok(Ok(Err(err))) => {
            return Err(RpcError::invalid_request(format!("unreadable body: {err}")).into())
        }
        Ok(Err(_)) => {
            return Err(RpcError::new(
                code::LIMIT_EXCEEDED,
                format!(
                    "limit exceeded: the body is longer than server.max_request_bytes \
                     ({limit} bytes)"
                ),
            )
            .into())
        }
        Err(_) => {
            return Err(ApiError::with_status(
                StatusCode::REQUEST_TIMEOUT,
                RpcError::invalid_request(format!(
                    "the body did not arrive within server.http_request_timeout_s ({}s)",
                    timeout.as_secs_f64()
                )),
            ))
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match strict_json::parse_params(&bytes) {
        Ok(Value::Object(params)) => Ok(params),
        Ok(_) => Err(RpcError::invalid_params("the body must be a JSON object").into()),
        Err(ParamsError::Duplicate(path)) => {
            Err(RpcError::invalid_params(duplicate_message(&path)).into())
        }
        Err(ParamsError::Syntax(err)) => Err(RpcError::parse_error(err).into()),
    }
}
