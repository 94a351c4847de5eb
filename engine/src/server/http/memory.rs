//! The `/v1/memory` routes of docs/protocol.md (HTTP): `POST check`, `POST feedback`, `POST search` (bodies
//! as the `memory.*` params) and `GET stats[?owner=]`, each answering its method's result.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};

use super::routes::{call, query, respond, with_body};
use super::{ApiError, State};
use crate::rpc::memory::{CHECK, FEEDBACK, SEARCH, STATS};
use crate::rpc::Caller;

/// Registers the routes under the `/v1` scope.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/memory/check", web::post().to(check))
        .route("/memory/feedback", web::post().to(feedback))
        .route("/memory/search", web::post().to(search))
        .route("/memory/stats", web::get().to(stats));
}

async fn check(
    state: web::Data<State>,
    caller: Caller,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, &caller, CHECK, body).await
}

async fn feedback(
    state: web::Data<State>,
    caller: Caller,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, &caller, FEEDBACK, body).await
}

async fn search(
    state: web::Data<State>,
    caller: Caller,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, &caller, SEARCH, body).await
}

async fn stats(
    state: web::Data<State>,
    caller: Caller,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let params: OwnerQuery = query(&req)?;
    let params = serde_json::to_value(params).expect("an owner query is plain JSON");
    respond(call(&state, &caller, STATS, params).await)
}

/// `GET stats`' query: the owner to report on, for a caller who may name one.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnerQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}
