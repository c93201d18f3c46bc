//! The labels of `plexus_api_requests_total` for a request: its verb (`get`, `list`, `watch`,
//! `patch`, `create`, `update`, `delete`) and resource (`pods`, `events`, …; `other` for a
//! path plexus does not send), and its answer's code. Bounded: no name or namespace.

/// The resources plexus asks for; any other is `other`.
const RESOURCES: &[&str] = &[
    "pods",
    "network-attachment-definitions",
    "events",
    "addressclaims",
    "nodes",
    "namespaces",
    "resourceclaims",
    "resourceslices",
    "tokenreviews",
    "subjectaccessreviews",
];

/// `(verb, resource)` of a request.
pub(crate) fn of(method: &http::Method, uri: &http::Uri) -> (&'static str, &'static str) {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/… or /apis/<group>/<version>/…, after any server path prefix.
    let rest = match segments.iter().position(|s| *s == "api" || *s == "apis") {
        Some(i) if segments[i] == "api" => segments.get(i + 2..),
        Some(i) => segments.get(i + 3..),
        None => None,
    }
    .unwrap_or_default();
    let rest = match rest {
        ["namespaces", _, more @ ..] if !more.is_empty() => more,
        r => r,
    };
    let resource = rest
        .first()
        .and_then(|r| RESOURCES.iter().find(|k| *k == r))
        .copied()
        .unwrap_or("other");
    let named = rest.len() > 1;
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::PATCH => "patch",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::DELETE => "delete",
        _ => "other",
    };
    (verb, resource)
}

/// The code label of an HTTP status.
pub(crate) fn code(status: u16) -> &'static str {
    const CODES: &[(u16, &str)] = &[
        (200, "200"),
        (201, "201"),
        (202, "202"),
        (204, "204"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (409, "409"),
        (410, "410"),
        (422, "422"),
        (429, "429"),
        (500, "500"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
    ];
    CODES.iter().find(|(c, _)| *c == status).map_or(
        match status {
            200..=299 => "2xx",
            400..=499 => "4xx",
            _ => "5xx",
        },
        |(_, s)| s,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(m: http::Method, u: &str) -> (&'static str, &'static str) {
        of(&m, &u.parse().unwrap())
    }

    #[test]
    fn verbs_and_resources_without_names() {
        use http::Method as M;
        assert_eq!(l(M::GET, "/api/v1/namespaces/ns/pods/p1"), ("get", "pods"));
        assert_eq!(
            l(M::PATCH, "/api/v1/namespaces/ns/pods/p1/status"),
            ("patch", "pods")
        );
        assert_eq!(
            l(M::GET, "/api/v1/namespaces/ns/pods?fieldSelector=x"),
            ("list", "pods")
        );
        assert_eq!(l(M::GET, "/api/v1/pods?watch=true"), ("watch", "pods"));
        assert_eq!(
            l(M::POST, "/api/v1/namespaces/ns/events"),
            ("create", "events")
        );
        assert_eq!(
            l(
                M::GET,
                "/apis/k8s.cni.cncf.io/v1/namespaces/ns/network-attachment-definitions/n"
            ),
            ("get", "network-attachment-definitions")
        );
        assert_eq!(
            l(
                M::PUT,
                "/k8s/clusters/c1/apis/plexus.io/v1/namespaces/ns/addressclaims/a"
            ),
            ("update", "addressclaims")
        );
        assert_eq!(
            l(M::DELETE, "/apis/x/v1/namespaces/ns/secrets/s"),
            ("delete", "other")
        );
        assert_eq!(l(M::GET, "/api/v1/namespaces/ns"), ("get", "namespaces"));
        assert_eq!(code(200), "200");
        assert_eq!(code(418), "4xx");
    }
}
