//! The file routes of docs/protocol.md (HTTP): `PUT|GET|DELETE /v1/sessions/{id}/files/{path}`
//! move a file's raw bytes, streamed both ways (an upload is written chunk by chunk as it
//! arrives, a download read chunk by chunk as it is sent; neither is held whole; a download
//! honours a single byte `Range`, so a broken one can resume), and
//! `GET /v1/sessions/{id}/files?dir=PATH` lists a directory as `session.files.list` does.

use std::time::Duration;

use actix_web::http::header::{self, ByteRangeSpec, ContentType, Header, Range};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;

use super::routes::query;
use super::{ApiError, State};
use crate::files::{whole_file, SessionFiles, Window};
use crate::rpc::files::Written;
use crate::rpc::{Caller, RpcError};

/// Registers the routes under the `/v1` scope.
pub(super) fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/sessions/{id}/files", web::get().to(list))
        .route("/sessions/{id}/files/{path:.*}", web::put().to(upload))
        .route("/sessions/{id}/files/{path:.*}", web::get().to(download))
        .route("/sessions/{id}/files/{path:.*}", web::delete().to(remove));
}

/// The query of the listing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    dir: String,
}

async fn files(state: &State, caller: &Caller, id: &str) -> Result<SessionFiles, ApiError> {
    Ok(state.dispatcher.files(caller, id).await?)
}

/// `GET /v1/sessions/{id}/files?dir=PATH`.
async fn list(
    state: web::Data<State>,
    caller: Caller,
    id: web::Path<String>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let ListQuery { dir } = query(&req)?;
    let entries = files(&state, &caller, &id).await?.list(&dir).await?;
    Ok(HttpResponse::Ok().json(entries))
}

/// `PUT /v1/sessions/{id}/files/{path}`: the body becomes the file; `{size}`.
async fn upload(
    state: web::Data<State>,
    caller: Caller,
    path: web::Path<(String, String)>,
    mut body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (id, path) = path.into_inner();
    let mut upload = files(&state, &caller, &id).await?.upload(&path).await?;
    let timeout = state.access.request_timeout;
    loop {
        let chunk = match tokio::time::timeout(timeout, body.next()).await {
            Ok(Some(Ok(chunk))) => chunk,
            Ok(None) => break,
            Ok(Some(Err(err))) => {
                return Err(RpcError::invalid_request(format!("unreadable body: {err}")).into())
            }
            Err(_) => return Err(stalled(timeout)),
        };
        upload.send(chunk.to_vec()).await?;
    }
    let size = upload.finish().await?;
    Ok(HttpResponse::Ok().json(Written { size }))
}

/// 408: no byte of the body came for `timeout`.
fn stalled(timeout: Duration) -> ApiError {
    ApiError::with_status(
        StatusCode::REQUEST_TIMEOUT,
        RpcError::invalid_request(format!(
            "the body stalled for server.http_request_timeout_s ({}s)",
            timeout.as_secs_f64()
        )),
    )
}

/// `GET /v1/sessions/{id}/files/{path}`: the file's bytes, or the one range of them that
/// `Range` asks for (206).
async fn download(
    state: web::Data<State>,
    caller: Caller,
    path: web::Path<(String, String)>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (id, path) = path.into_inner();
    let asked = requested_range(&req);
    let window: Window = match asked.clone() {
        Some(spec) => Box::new(move |size| {
            let (first, last) = spec.to_satisfiable_range(size)?;
            Some(first..last + 1)
        }),
        None => whole_file(),
    };
    let download = files(&state, &caller, &id)
        .await?
        .download(&path, window)
        .await?;
    let size = download.size;
    let Some(range) = download.range.clone() else {
        let refused = ApiError::with_status(
            StatusCode::RANGE_NOT_SATISFIABLE,
            RpcError::invalid_params(format!(
                "range {} is past the end of {path:?} ({size} bytes)",
                asked.map_or_else(String::new, |spec| spec.to_string())
            )),
        );
        let mut response = refused.error_response();
        response.headers_mut().insert(
            header::CONTENT_RANGE,
            header::HeaderValue::from_str(&format!("bytes */{size}")).expect("ASCII"),
        );
        return Ok(response);
    };
    let mut response = match asked {
        Some(_) => {
            let content_range = format!("bytes {}-{}/{size}", range.start, range.end - 1);
            let mut partial = HttpResponse::PartialContent();
            partial.insert_header((header::CONTENT_RANGE, content_range));
            partial
        }
        None => HttpResponse::Ok(),
    };
    let body = download.map(|chunk| chunk.map(Bytes::from));
    Ok(response
        .content_type(ContentType::octet_stream())
        .insert_header((header::ACCEPT_RANGES, "bytes"))
        .no_chunking(range.end - range.start)
        .streaming(body))
}

/// The one byte range a download's `Range` asks for. Several ranges, another unit or a
/// malformed header get the whole file, as RFC 9110 allows; so does a range made conditional
/// by `If-Range`, whose validator can never match (pyvisor sends no `ETag` or
/// `Last-Modified`).
fn requested_range(req: &HttpRequest) -> Option<ByteRangeSpec> {
    if req.headers().contains_key(header::IF_RANGE) {
        return None;
    }
    match Range::parse(req) {
        Ok(Range::Bytes(mut specs)) if specs.len() == 1 => specs.pop(),
        _ => None,
    }
}

/// `DELETE /v1/sessions/{id}/files/{path}`: `{}`.
async fn remove(
    state: web::Data<State>,
    caller: Caller,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (id, path) = path.into_inner();
    files(&state, &caller, &id).await?.remove(&path).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({})))
}
