//! The `/v1/tasks` routes of docs/protocol.md (HTTP): `POST /v1/tasks` (body as the
//! `task.run` params) runs a task and answers its result; `POST /v1/tasks/{task_id}/cancel`
//! answers `task.cancel`'s. Steps are not streamed over plain HTTP (`stream` sends nothing);
//! the WebSocket or the socket stream them. A client that goes away ends its task.

use actix_web::{web, HttpResponse};

use super::routes::{call, respond, with_body};
use super::{ApiError, State};
use crate::rpc::task::{CANCEL, RUN};
use crate::rpc::Caller;

/// Registers the routes under the `/v1` scope.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/tasks", web::post().to(run))
        .route("/tasks/{task_id}/cancel", web::post().to(cancel));
}

async fn run(
    state: web::Data<State>,
    caller: Caller,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    with_body(&state, &caller, RUN, body).await
}

async fn cancel(
    state: web::Data<State>,
    caller: Caller,
    task_id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let params = serde_json::json!({ "task_id": task_id.into_inner() });
    respond(call(&state, &caller, CANCEL, params).await)
}
