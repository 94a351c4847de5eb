//! The checks in front of every HTTP route, in this order: a `Host` that is not a loopback
//! name or address nor in `allowed_hosts` gets 421 (DNS rebinding); an `Origin` not in
//! `allowed_origins` gets 403 (a web page the user visits); a missing or wrong bearer token
//! gets 401; a POST or PUT body that is not `application/json` gets 415 (the `text/plain`
//! form post a page may send without asking), except the raw bytes of a file upload: a PUT
//! of `application/octet-stream` (which no page sends without a CORS preflight). What passes carries its [`Caller`]: the
//! admin token's, or the owner a token is bound to.

use std::future::{ready, Ready};
use std::net::IpAddr;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{
    HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN,
    TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest, ResponseError};

use super::{ApiError, State};
use crate::cluster::forward::FORWARDED_BY;
use crate::rpc::{code, Caller, RpcError};

/// How long a request's headers, and separately its body, may take to arrive.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Who may call the HTTP API and from where, besides the admin token.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpAccess {
    /// Tokens bound to one owner each (`[[server.tokens]]`).
    pub owner_tokens: Vec<OwnerToken>,
    /// `Origin` values accepted (`server.http_allowed_origins`); requests without one pass.
    pub allowed_origins: Vec<String>,
    /// Host names accepted besides loopback ones (`server.http_allowed_hosts`).
    pub allowed_hosts: Vec<String>,
    /// The header read timeout, and the body read timeout.
    pub request_timeout: Duration,
}

impl Default for HttpAccess {
    fn default() -> Self {
        Self {
            owner_tokens: Vec::new(),
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for HttpAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpAccess")
            .field("owner_tokens", &self.owner_tokens)
            .field("allowed_origins", &self.allowed_origins)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// A bearer token that makes its bearer `owner`.
#[derive(Clone, PartialEq, Eq)]
pub struct OwnerToken {
    pub owner: String,
    pub token: String,
}

impl std::fmt::Debug for OwnerToken {
    /// The token itself stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerToken")
            .field("owner", &self.owner)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Middleware: the checks of the module documentation; the caller goes into the request's
/// extensions for the handlers.
pub(super) async fn guard(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let state = req
        .app_data::<web::Data<State>>()
        .expect("the App is built with its State")
        .clone();
    let headers = req.headers();
    let refusal = if !host_allowed(headers.get(HOST), &state.access.allowed_hosts) {
        Some(refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "the Host header names neither a loopback address nor one of \
             server.http_allowed_hosts",
        ))
    } else if !origin_allowed(headers.get(ORIGIN), &state.access.allowed_origins) {
        Some(refuse(
            StatusCode::FORBIDDEN,
            "the Origin header is not one of server.http_allowed_origins",
        ))
    } else {
        None
    };
    if let Some(response) = refusal {
        return Ok(req.into_response(response).map_into_right_body());
    }
    let Some(mut caller) = authenticate(headers, state.token.as_deref(), &state.access) else {
        let mut response = ApiError::from(RpcError::unauthorized()).error_response();
        response
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Ok(req.into_response(response).map_into_right_body());
    };
    if headers.contains_key(FORWARDED_BY) {
        caller = caller.forwarded_by_node();
    }
    let sends_body = matches!(*req.method(), Method::POST | Method::PUT);
    let raw_upload = *req.method() == Method::PUT && declared(headers, "application/octet-stream");
    if sends_body && !json_or_empty(headers) && !raw_upload {
        let response = ApiError::with_status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            RpcError::invalid_request("the body must be sent as Content-Type: application/json"),
        )
        .error_response();
        return Ok(req.into_response(response).map_into_right_body());
    }
    req.extensions_mut().insert(caller);
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
}

/// A refusal by the Host or Origin check.
fn refuse(status: StatusCode, message: &str) -> actix_web::HttpResponse {
    ApiError::with_status(
        status,
        RpcError::new(code::UNAUTHORIZED, format!("unauthorized: {message}")),
    )
    .error_response()
}

/// The caller the request's token makes it; without any token configured, an admin (the
/// server then listens on loopback only). Every token is compared, in constant time each.
fn authenticate(headers: &HeaderMap, admin: Option<&str>, access: &HttpAccess) -> Option<Caller> {
    if admin.is_none() && access.owner_tokens.is_empty() {
        return Some(Caller::admin());
    }
    let presented = bearer(headers.get(AUTHORIZATION))?;
    let mut caller = None;
    if admin.is_some_and(|token| constant_time_eq(presented.as_bytes(), token.as_bytes())) {
        caller = Some(Caller::admin());
    }
    for bound in &access.owner_tokens {
        let matches = constant_time_eq(presented.as_bytes(), bound.token.as_bytes());
        if matches && caller.is_none() {
            caller = Some(Caller::owner(bound.owner.clone()));
        }
    }
    caller
}

/// The credentials of `Authorization: Bearer <token>`.
fn bearer(header: Option<&HeaderValue>) -> Option<&str> {
    let value = header.and_then(|value| value.to_str().ok())?;
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim())
}

/// Compares without an early exit, so the time taken says nothing about where the first
/// difference is (the length is not secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// Whether the `Host` header (absent: not a browser) names a loopback host or an allowed one.
fn host_allowed(header: Option<&HeaderValue>, allowed: &[String]) -> bool {
    let Some(value) = header else {
        return true;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let host = host_name(value);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        if ip.is_loopback() {
            return true;
        }
    }
    allowed
        .iter()
        .any(|name| host_name(name).eq_ignore_ascii_case(host))
}

/// The host part of a `Host` value: without the port, brackets kept for IPv6.
fn host_name(value: &str) -> &str {
    let value = value.trim();
    if value.starts_with('[') {
        return value.split_inclusive(']').next().unwrap_or(value);
    }
    value.split(':').next().unwrap_or(value)
}

/// Whether the `Origin` header is absent (not a cross-site browser request) or allowed.
fn origin_allowed(header: Option<&HeaderValue>, allowed: &[String]) -> bool {
    match header.map(HeaderValue::to_str) {
        None => true,
        Some(Ok(origin)) => allowed.iter().any(|known| {
            known
                .trim_end_matches('/')
                .eq_ignore_ascii_case(origin.trim())
        }),
        Some(Err(_)) => false,
    }
}

/// Whether the body is declared as `mime`.
fn declared(headers: &HeaderMap, mime: &str) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|given| given.trim().eq_ignore_ascii_case(mime))
}

/// Whether the body is declared JSON, or there is none and no type is declared.
fn json_or_empty(headers: &HeaderMap) -> bool {
    match headers.get(CONTENT_TYPE).map(HeaderValue::to_str) {
        Some(Ok(_)) => declared(headers, "application/json"),
        Some(Err(_)) => false,
        None => {
            let chunked = headers.contains_key(TRANSFER_ENCODING);
            let length = headers
                .get(CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
                .map(str::trim);
            !chunked && matches!(length, None | Some("0"))
        }
    }
}

/// Handlers take the caller the guard established.
impl FromRequest for Caller {
    type Error = actix_web::Error;
    type Future = Ready<Result<Caller, actix_web::Error>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let caller = req.extensions().get::<Caller>().cloned();
        ready(caller.ok_or_else(|| ApiError::from(RpcError::unauthorized()).into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(value: &'static str) -> HeaderValue {
        HeaderValue::from_static(value)
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        let access = HttpAccess {
            owner_tokens: vec![OwnerToken {
                owner: "alice".into(),
                token: "al1ce".into(),
            }],
            ..HttpAccess::default()
        };
        let caller = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, header(value));
            authenticate(&headers, Some("s3cret"), &access)
        };
        assert_eq!(caller("Bearer s3cret"), Some(Caller::admin()));
        assert_eq!(caller("bearer s3cret"), Some(Caller::admin()));
        assert_eq!(caller("Bearer al1ce"), Some(Caller::owner("alice")));
        for wrong in [
            "Bearer s3cre",
            "Bearer s3cret!",
            "Basic s3cret",
            "s3cret",
            "Bearer al1c",
        ] {
            assert_eq!(caller(wrong), None, "{wrong}");
        }
        assert_eq!(
            authenticate(&HeaderMap::new(), Some("s3cret"), &access),
            None
        );
        assert_eq!(
            authenticate(&HeaderMap::new(), None, &HttpAccess::default()),
            Some(Caller::admin()),
            "no token configured: every caller is an admin"
        );
    }

    #[test]
    fn hosts_must_be_loopback_or_allowed() {
        let allowed = vec!["pyvisor.example".to_owned()];
        for ok in [
            "localhost",
            "LOCALHOST:8787",
            "127.0.0.1",
            "127.3.2.1:80",
            "[::1]:8787",
            "[::1]",
            "pyvisor.example:443",
        ] {
            assert!(host_allowed(Some(&header(ok)), &allowed), "{ok}");
        }
        for bad in [
            "evil.example",
            "localhost.evil.example",
            "10.0.0.1:8787",
            "[::2]:1",
        ] {
            assert!(!host_allowed(Some(&header(bad)), &allowed), "{bad}");
        }
        assert!(host_allowed(None, &[]));
    }

    #[test]
    fn origins_must_be_listed() {
        let allowed = vec!["https://app.example".to_owned()];
        assert!(origin_allowed(None, &[]));
        assert!(origin_allowed(
            Some(&header("https://app.example")),
            &allowed
        ));
        assert!(!origin_allowed(
            Some(&header("https://evil.example")),
            &allowed
        ));
        assert!(!origin_allowed(Some(&header("null")), &allowed));
    }

    #[test]
    fn bodies_must_be_json_or_absent() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(
                    actix_web::http::header::HeaderName::from_static(name),
                    header(value),
                );
            }
            json_or_empty(&headers)
        };
        assert!(with(&[("content-type", "application/json")]));
        assert!(with(&[("content-type", "Application/JSON; charset=utf-8")]));
        assert!(with(&[]));
        assert!(with(&[("content-length", "0")]));
        assert!(!with(&[("content-type", "text/plain")]));
        assert!(!with(&[(
            "content-type",
            "application/x-www-form-urlencoded"
        )]));
        assert!(!with(&[("content-length", "12")]));
        assert!(!with(&[("transfer-encoding", "chunked")]));
    }
}
