//! `K8sError`: what went wrong talking to the API server, with the object it was about.
//!
//! Display strings never contain credentials: kubeconfig parse errors are reported without
//! the parser's excerpt (the file may hold a bearer token), and request errors only carry the
//! HTTP status and the API server's `Status` message.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use super::transport::TransportError;

/// CNI error code 7: invalid network configuration (used for kubeconfig / client problems).
pub const CNI_INVALID_CONFIG: u32 = 7;
/// CNI error code 11: try again later (API server unreachable or overloaded).
pub const CNI_TRY_AGAIN_LATER: u32 = 11;
/// Plugin-specific CNI error code 102 for every other Kubernetes failure (the API server refused:
/// 403, 422, UID mismatch, undecodable answer), as docs/design.md lists it.
pub const CNI_K8S_FAILURE: u32 = plexus_conf::error::code::KUBERNETES;

/// An error from the Kubernetes API layer.
///
/// `what` names the operation (`"get pod"`, `"get network-attachment-definition"`,
/// `"patch pod status"`, `"post event"`), `ns`/`name` the object.
#[derive(Debug, Error)]
pub enum K8sError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {}: {reason}", path.display())]
    Kubeconfig {
        /// Path of the kubeconfig.
        path: PathBuf,
        /// Why (never contains file contents).
        reason: String,
    },
    /// The in-cluster configuration (service host/port, token, CA) is unusable.
    #[error("in-cluster Kubernetes config: {0}")]
    InCluster(String),
    /// The HTTP client could not be built (TLS setup, no tokio runtime...).
    #[error("building the Kubernetes client: {0}")]
    Client(String),
    /// Transport failure: connection refused/reset, TLS failure, connection closed early.
    #[error("{what} {ns}/{name}: API server unreachable: {reason}")]
    Unreachable {
        /// Operation.
        what: &'static str,
        /// Namespace.
        ns: String,
        /// Object name.
        name: String,
        /// Transport error text.
        reason: String,
    },
    /// No complete answer within the per-request timeout.
    #[error("{what} {ns}/{name}: no answer within {timeout:?}")]
    Timeout {
        /// Operation.
        what: &'static str,
        /// Namespace.
        ns: String,
        /// Object name.
        name: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The API server answered with a non-success status.
    #[error("{what} {ns}/{name}: HTTP {code} {reason}: {message}")]
    Api {
        /// Operation.
        what: &'static str,
        /// Namespace.
        ns: String,
        /// Object name.
        name: String,
        /// HTTP status code.
        code: u16,
        /// `Status.reason` (e.g. `NotFound`, `Conflict`).
        reason: String,
        /// `Status.message`.
        message: String,
    },
    /// The answer could not be decoded.
    #[error("{what} {ns}/{name}: undecodable answer: {reason}")]
    Decode {
        /// Operation.
        what: &'static str,
        /// Namespace.
        ns: String,
        /// Object name.
        name: String,
        /// Decoder error.
        reason: String,
    },
    /// The pod found under `ns/name` is not the sandbox's pod (`K8S_POD_UID` differs).
    #[error("pod {ns}/{name}: expected pod UID {expected:?} but got {got:?} from the API")]
    UidMismatch {
        /// Namespace.
        ns: String,
        /// Pod name.
        name: String,
        /// UID from `CNI_ARGS` (`K8S_POD_UID`).
        expected: String,
        /// UID of the API object.
        got: String,
    },
    /// The pod no longer exists (404 on write). Callers usually tolerate this.
    #[error("pod {ns}/{name} no longer exists")]
    PodGone {
        /// Namespace.
        ns: String,
        /// Pod name.
        name: String,
    },
    /// The UID precondition failed: a new pod with the same name replaced ours; nothing was written.
    #[error("pod {ns}/{name} was replaced (UID {uid} no longer matches); not writing to it")]
    PodReplaced {
        /// Namespace.
        ns: String,
        /// Pod name.
        name: String,
        /// The UID we expected.
        uid: String,
    },
    /// Any other failure (request building, auth plugin...).
    #[error("{what} {ns}/{name}: {reason}")]
    Other {
        /// Operation.
        what: &'static str,
        /// Namespace.
        ns: String,
        /// Object name.
        name: String,
        /// Error text.
        reason: String,
    },
    /// The namespace or name is not a Kubernetes name: no request was made (it could address
    /// another object). Code 7: ADD refuses such pod names from `CNI_ARGS` earlier (code 4), so
    /// what is left here comes from configuration (`clusterNetwork`, `defaultNetworks`, NADs).
    #[error("{what} {ns:?}/{name:?}: not requested: {reason}")]
    InvalidName {
        /// Operation.
        what: &'static str,
        /// Namespace as given.
        ns: String,
        /// Object name as given.
        name: String,
        /// Which part is wrong and why.
        reason: String,
    },
    /// HTTP 404 that does not name the object asked for: the path is not served (a wrong
    /// server URL or path prefix, a proxy, the NAD CRD not installed). Not "the object is gone".
    #[error("{what} {ns}/{name}: HTTP 404 for a path the API server does not serve ({message}): check the server URL and that the API (or CRD) is installed")]
    NoSuchPath {
        /// Operation.
        what: &'static str,
        /// Namespace.
        ns: String,
        /// Object name.
        name: String,
        /// The start of the answer.
        message: String,
    },
    /// The kubeconfig's `exec` credential plugin did not answer in time or failed: the
    /// credential may be there on the next call (code 11).
    #[error("kubeconfig {}: {reason}", path.display())]
    CredentialUnavailable {
        /// Path of the kubeconfig.
        path: PathBuf,
        /// What the plugin did (never its output).
        reason: String,
    },
}

/// The object a request is about; used to label errors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx<'a> {
    pub what: &'static str,
    pub ns: &'a str,
    pub name: &'a str,
}

impl K8sError {
    /// True for failures worth retrying: transport errors, timeouts, HTTP 5xx and 429.
    pub fn is_transient(&self) -> bool {
        match self {
            K8sError::Unreachable { .. }
            | K8sError::Timeout { .. }
            | K8sError::CredentialUnavailable { .. } => true,
            K8sError::Api { code, .. } => *code >= 500 || *code == 429,
            _ => false,
        }
    }

    /// True when the object does not exist (HTTP 404 or [`K8sError::PodGone`]).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            K8sError::Api { code: 404, .. } | K8sError::PodGone { .. }
        )
    }

    /// The CNI error code to report for this error:
    /// [`CNI_TRY_AGAIN_LATER`] (11) for transient errors, [`CNI_INVALID_CONFIG`] (7) for
    /// kubeconfig / in-cluster / client-construction problems, HTTP 401 (bad credentials) and
    /// names that are not Kubernetes names, [`CNI_K8S_FAILURE`] (102) for everything else (403,
    /// a 404 for a path not served, UID mismatch, decode errors...).
    pub fn cni_code(&self) -> u32 {
        match self {
            e if e.is_transient() => CNI_TRY_AGAIN_LATER,
            K8sError::Kubeconfig { .. } | K8sError::InCluster(_) | K8sError::Client(_) => {
                CNI_INVALID_CONFIG
            }
            K8sError::Api { code: 401, .. } => CNI_INVALID_CONFIG,
            K8sError::InvalidName { .. } => CNI_INVALID_CONFIG,
            _ => CNI_K8S_FAILURE,
        }
    }

    /// [`K8sError::InvalidName`] unless `ctx`'s namespace and name are Kubernetes names.
    pub(crate) fn check_names(ctx: Ctx<'_>) -> Result<(), Self> {
        match super::names::ref_problem(ctx.ns, ctx.name) {
            None => Ok(()),
            Some(reason) => Err(K8sError::InvalidName {
                what: ctx.what,
                ns: ctx.ns.to_owned(),
                name: ctx.name.to_owned(),
                reason,
            }),
        }
    }

    /// [`K8sError::InvalidName`] unless `ctx`'s namespace is a Kubernetes name (for a LIST).
    pub(crate) fn check_namespace(ctx: Ctx<'_>) -> Result<(), Self> {
        match super::names::namespace_problem(ctx.ns) {
            None => Ok(()),
            Some(reason) => Err(K8sError::InvalidName {
                what: ctx.what,
                ns: ctx.ns.to_owned(),
                name: String::new(),
                reason,
            }),
        }
    }

    pub(crate) fn timeout(ctx: Ctx<'_>, timeout: Duration) -> Self {
        K8sError::Timeout {
            what: ctx.what,
            ns: ctx.ns.to_owned(),
            name: ctx.name.to_owned(),
            timeout,
        }
    }
}

impl K8sError {
    /// Label a transport failure with the object it was about.
    pub(crate) fn from_transport(ctx: Ctx<'_>, err: TransportError) -> Self {
        let (what, ns, name) = (ctx.what, ctx.ns.to_owned(), ctx.name.to_owned());
        match err {
            TransportError::Unreachable(reason) => K8sError::Unreachable {
                what,
                ns,
                name,
                reason,
            },
            TransportError::Other(reason) => K8sError::Other {
                what,
                ns,
                name,
                reason,
            },
        }
    }

    /// The error for a non-success answer: the API server's `Status` when the body is one,
    /// else the HTTP status with the start of the body.
    ///
    /// A 404 means "no such object" only when it is the API server's `NotFound` `Status` naming
    /// the object (`details.name`); any other 404 is [`K8sError::NoSuchPath`].
    pub(crate) fn from_answer(ctx: Ctx<'_>, code: u16, body: &[u8]) -> Self {
        #[derive(serde::Deserialize)]
        struct Status {
            #[serde(default)]
            reason: String,
            #[serde(default)]
            message: String,
            #[serde(default)]
            details: Option<Details>,
        }
        #[derive(serde::Deserialize)]
        struct Details {
            #[serde(default)]
            name: String,
        }
        let status = serde_json::from_slice::<Status>(body).ok();
        if code == 404 {
            let names_object = status.as_ref().is_some_and(|s| {
                s.reason == "NotFound" && s.details.as_ref().is_some_and(|d| d.name == ctx.name)
            });
            if !names_object {
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let cut = text.char_indices().nth(200).map_or(text.len(), |(i, _)| i);
                return K8sError::NoSuchPath {
                    what: ctx.what,
                    ns: ctx.ns.to_owned(),
                    name: ctx.name.to_owned(),
                    message: status
                        .map(|s| s.message)
                        .filter(|m| !m.is_empty())
                        .unwrap_or_else(|| text[..cut].to_owned()),
                };
            }
        }
        let (reason, message) = match status {
            Some(s) if !s.reason.is_empty() || !s.message.is_empty() => (s.reason, s.message),
            _ => {
                let reason = http::StatusCode::from_u16(code)
                    .ok()
                    .and_then(|c| c.canonical_reason())
                    .unwrap_or("")
                    .to_owned();
                let text = String::from_utf8_lossy(body);
                let text = text.trim();
                let cut = text.char_indices().nth(200).map_or(text.len(), |(i, _)| i);
                (reason, text[..cut].to_owned())
            }
        };
        K8sError::Api {
            what: ctx.what,
            ns: ctx.ns.to_owned(),
            name: ctx.name.to_owned(),
            code,
            reason,
            message,
        }
    }
}

/// `err: source: source…` on one line, leaving out a source whose text its error already shows.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Ctx<'static> {
        Ctx {
            what: "get pod",
            ns: "ns1",
            name: "p1",
        }
    }

    fn api(code: u16) -> K8sError {
        K8sError::from_answer(
            ctx(),
            code,
            br#"{"kind":"Status","reason":"R","message":"m","details":{"name":"p1"}}"#,
        )
    }

    #[test]
    fn only_a_not_found_naming_the_object_means_it_is_gone() {
        let gone = br#"{"kind":"Status","status":"Failure","message":"pods \"p1\" not found","reason":"NotFound","details":{"name":"p1","kind":"pods"},"code":404}"#;
        assert!(K8sError::from_answer(ctx(), 404, gone).is_not_found());
        // A wrong path: the Go mux's text, a proxy's page, a Status for an unserved resource,
        // a NotFound about another object.
        for body in [
            &b"404 page not found"[..],
            b"<html>nginx</html>",
            br#"{"kind":"Status","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#,
            br#"{"kind":"Status","message":"namespaces \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"namespaces"},"code":404}"#,
            b"",
        ] {
            let e = K8sError::from_answer(ctx(), 404, body);
            assert!(matches!(e, K8sError::NoSuchPath { .. }), "{e:?}");
            assert!(!e.is_not_found() && !e.is_transient(), "{e:?}");
            assert_eq!(e.cni_code(), CNI_K8S_FAILURE);
            assert!(e.to_string().contains("get pod ns1/p1: HTTP 404"), "{e}");
        }
    }

    #[test]
    fn names_are_checked_before_a_request() {
        assert!(K8sError::check_names(ctx()).is_ok());
        let bad = Ctx {
            what: "get pod",
            ns: "ns1",
            name: "../../secrets/x",
        };
        let e = K8sError::check_names(bad).unwrap_err();
        assert!(matches!(e, K8sError::InvalidName { .. }), "{e:?}");
        assert_eq!(e.cni_code(), 7);
        assert!(e.to_string().contains("not a valid object name"), "{e}");
    }

    #[test]
    fn classifies_status_codes() {
        for code in [500, 502, 503, 504, 429] {
            assert!(api(code).is_transient(), "{code}");
            assert_eq!(api(code).cni_code(), CNI_TRY_AGAIN_LATER);
        }
        for code in [400, 403, 404, 409, 422] {
            assert!(!api(code).is_transient(), "{code}");
            assert_eq!(api(code).cni_code(), CNI_K8S_FAILURE);
        }
        assert_eq!(api(401).cni_code(), CNI_INVALID_CONFIG);
        assert!(!api(500).is_not_found());
        assert_eq!(
            api(503).to_string(),
            "get pod ns1/p1: HTTP 503 R: m".to_string()
        );
    }

    #[test]
    fn config_errors_map_to_code_7() {
        let e = K8sError::Kubeconfig {
            path: "/x".into(),
            reason: "r".into(),
        };
        assert_eq!(e.cni_code(), CNI_INVALID_CONFIG);
        assert_eq!(
            K8sError::timeout(ctx(), Duration::from_secs(1)).cni_code(),
            CNI_TRY_AGAIN_LATER
        );
    }

    #[test]
    fn a_status_body_gives_its_reason_and_message() {
        let body = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"p1\" not found","reason":"NotFound","code":404,"details":{"name":"p1","kind":"pods"}}"#;
        match K8sError::from_answer(ctx(), 404, body) {
            K8sError::Api {
                code,
                reason,
                message,
                ..
            } => {
                assert_eq!((code, reason.as_str()), (404, "NotFound"));
                assert_eq!(message, "pods \"p1\" not found");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn another_body_gives_the_http_reason_and_its_start() {
        let body = "x".repeat(1000);
        match K8sError::from_answer(ctx(), 503, body.as_bytes()) {
            K8sError::Api {
                code,
                reason,
                message,
                ..
            } => {
                assert_eq!((code, reason.as_str()), (503, "Service Unavailable"));
                assert_eq!(message.len(), 200);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn transport_failures_keep_their_class() {
        let e = K8sError::from_transport(ctx(), TransportError::Unreachable("refused".into()));
        assert!(e.is_transient(), "{e:?}");
        let e = K8sError::from_transport(ctx(), TransportError::Other("bad token".into()));
        assert!(!e.is_transient(), "{e:?}");
        assert!(e.to_string().contains("get pod ns1/p1"), "{e}");
    }
}
