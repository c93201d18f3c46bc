//! `/_test/...` admin endpoints so a separate process can read the request log, take the server
//! down for a while and register tokens (faults in front of the real apiserver:
//! [`crate::realk8s::fault_proxy`]).
//! They need `Authorization: Bearer <admin token>`, are never faulted and never logged.
//!
//! | method, path | body | effect |
//! | --- | --- | --- |
//! | `GET /_test/requests` | | the request log as a JSON array |
//! | `DELETE /_test/requests` | | clear the log |
//! | `POST /_test/down` | `{"ms":1000}` | after answering, go down for `ms`, then up on the same port |
//! | `POST /_test/tokens` | `{"token":"t","user":"u","access":"full\|read-only\|none"}` | register a token |

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::Response;
use serde::Deserialize;
use serde_json::{json, Value};

use super::auth::{bearer, Access};
use super::server::{error_response, json_response, lock, read_body, Shared};
use super::status::ApiError;

#[derive(Deserialize)]
struct DownBody {
    ms: u64,
}

#[derive(Deserialize)]
struct TokenBody {
    token: String,
    user: String,
    access: String,
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding body: {e}")))
}

/// Serves one admin request.
pub async fn handle(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    authz: Option<&str>,
    body: Incoming,
) -> Response<Full<Bytes>> {
    let Some(admin) = shared.admin_token.as_deref() else {
        return error_response(&ApiError::no_route());
    };
    if authz.and_then(bearer) != Some(admin) {
        return error_response(&ApiError::unauthorized());
    }
    let body = match read_body(body, 64 * 1024).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    match route(shared, method, path, &body) {
        Ok((code, v)) => json_response(code, &v),
        Err(e) => error_response(&e),
    }
}

fn route(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Result<(u16, Value), ApiError> {
    let ok = Ok((200, json!({})));
    match (method.as_str(), path.trim_end_matches('/')) {
        ("GET", "/_test/requests") => Ok((
            200,
            serde_json::to_value(lock(&shared.log).all()).unwrap_or_default(),
        )),
        ("DELETE", "/_test/requests") => {
            lock(&shared.log).clear();
            ok
        }
        ("POST", "/_test/down") => {
            let b: DownBody = parse(body)?;
            let shared = Arc::clone(shared);
            // Blocking pool: down()/up() wait for the accept loop, which runs on the runtime.
            shared.handle.spawn_blocking({
                let shared = Arc::clone(&shared);
                move || {
                    // Let this response reach the client before its connection is dropped.
                    std::thread::sleep(Duration::from_millis(50));
                    shared.down();
                    std::thread::sleep(Duration::from_millis(b.ms));
                    if let Err(e) = shared.up() {
                        tracing::error!(error = %e, addr = %shared.addr, "cannot rebind after down");
                    }
                }
            });
            Ok((202, json!({ "downForMs": b.ms })))
        }
        ("POST", "/_test/tokens") => {
            let b: TokenBody = parse(body)?;
            let access = match b.access.as_str() {
                "full" => Access::Full,
                "read-only" => Access::ReadOnly,
                "none" => Access::None,
                other => return Err(ApiError::bad_request(format!("unknown access {other:?}"))),
            };
            lock(&shared.tokens).add(&b.token, &b.user, access);
            ok
        }
        ("GET", "/_test/health") => Ok((200, json!({ "up": shared.is_up() }))),
        _ => Err(ApiError::no_route()),
    }
}
