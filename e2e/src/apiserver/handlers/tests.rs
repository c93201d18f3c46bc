//! Unit tests of the resource handlers against the store.

use super::*;

fn req<'a>(
    method: &'a Method,
    q: &'a Query,
    ct: Option<&'a str>,
    body: &'a [u8],
) -> ApiRequest<'a> {
    ApiRequest {
        method,
        query: q,
        content_type: ct,
        body,
    }
}

fn pod_route(status: bool) -> Route {
    Route::Object {
        res: Resource::Pod,
        ns: "a".into(),
        name: "p".into(),
        status,
    }
}

fn seeded() -> Store {
    let mut s = Store::default();
    s.create(Resource::Namespace, "", "a", json!({}));
    s.create(
        Resource::Pod,
        "a",
        "p",
        json!({"metadata":{"annotations":{"x":"1"}},"spec":{"containers":[{"name":"c","image":"i"}]},"status":{"phase":"Running"}}),
    );
    s
}

#[test]
fn status_patch_only_touches_status_and_annotations() {
    let mut s = seeded();
    let q = Query::default();
    let body = br#"{"metadata":{"annotations":{"y":"2"},"finalizers":["f"]},"spec":{"nodeName":"n"},"status":{"phase":"Failed"}}"#;
    let (code, obj) = handle(
        &mut s,
        &pod_route(true),
        &req(&Method::PATCH, &q, Some(MERGE), body),
    )
    .unwrap();
    assert_eq!(code, 200);
    assert_eq!(obj["status"]["phase"], "Failed");
    assert_eq!(obj["metadata"]["annotations"], json!({"x":"1","y":"2"}));
    assert!(obj["metadata"].get("finalizers").is_none());
    assert!(obj["spec"].get("nodeName").is_none());
    assert_eq!(meta_str(&obj, "resourceVersion"), "3");
}

#[test]
fn main_resource_patch_ignores_status_and_noop_keeps_rv() {
    let mut s = seeded();
    let q = Query::default();
    let (_, obj) = handle(
        &mut s,
        &pod_route(false),
        &req(
            &Method::PATCH,
            &q,
            Some(STRATEGIC),
            br#"{"status":{"phase":"Failed"}}"#,
        ),
    )
    .unwrap();
    assert_eq!(obj["status"]["phase"], "Running");
    assert_eq!(meta_str(&obj, "resourceVersion"), "2");
    let e = handle(
        &mut s,
        &pod_route(false),
        &req(
            &Method::PATCH,
            &q,
            Some(MERGE),
            br#"{"spec":{"nodeName":"other"}}"#,
        ),
    )
    .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
}

#[test]
fn preconditions_and_errors() {
    let mut s = seeded();
    let q = Query::default();
    let e = handle(
        &mut s,
        &pod_route(false),
        &req(
            &Method::PATCH,
            &q,
            Some(MERGE),
            br#"{"metadata":{"uid":"zzz"}}"#,
        ),
    )
    .unwrap_err();
    // A real kube-apiserver validates a patched uid as immutable (422), it is no precondition.
    assert_eq!((e.code, e.reason), (422, "Invalid"));
    assert_eq!(
        e.message,
        "Pod \"p\" is invalid: metadata.uid: Invalid value: \"zzz\": field is immutable"
    );
    let e = handle(
        &mut s,
        &pod_route(false),
        &req(
            &Method::PATCH,
            &q,
            Some(MERGE),
            br#"{"metadata":{"resourceVersion":"1"}}"#,
        ),
    )
    .unwrap_err();
    assert_eq!(e.message, "Operation cannot be fulfilled on pods \"p\": the object has been modified; please apply your changes to the latest version and try again");
    let e = handle(
        &mut s,
        &pod_route(false),
        &req(
            &Method::PATCH,
            &q,
            Some("application/apply-patch+yaml"),
            b"{}",
        ),
    )
    .unwrap_err();
    assert_eq!(e.code, 415);
    let e = handle(
        &mut s,
        &pod_route(false),
        &req(
            &Method::PATCH,
            &q,
            Some(JSON_PATCH),
            br#"[{"op":"test","path":"/metadata/name","value":"q"}]"#,
        ),
    )
    .unwrap_err();
    assert_eq!(e.code, 422);
    let coll = Route::Collection {
        res: Resource::Pod,
        ns: Some("a".into()),
    };
    let e = handle(
        &mut s,
        &coll,
        &req(
            &Method::POST,
            &q,
            Some(JSON),
            br#"{"metadata":{"name":"p"}}"#,
        ),
    )
    .unwrap_err();
    assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
    let e = handle(
        &mut s,
        &coll,
        &req(
            &Method::POST,
            &q,
            Some(JSON),
            br#"{"metadata":{"name":"Bad_Name"}}"#,
        ),
    )
    .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
    let other = Route::Collection {
        res: Resource::Pod,
        ns: Some("nope".into()),
    };
    let e = handle(
        &mut s,
        &other,
        &req(
            &Method::POST,
            &q,
            Some(JSON),
            br#"{"metadata":{"name":"p"}}"#,
        ),
    )
    .unwrap_err();
    assert_eq!(e.message, "namespaces \"nope\" not found");
    let e = handle(
        &mut s,
        &pod_route(false),
        &req(
            &Method::DELETE,
            &q,
            None,
            br#"{"preconditions":{"uid":"u"}}"#,
        ),
    )
    .unwrap_err();
    assert_eq!(e.code, 409);
    let (code, _) = handle(
        &mut s,
        &pod_route(false),
        &req(&Method::DELETE, &q, None, b""),
    )
    .unwrap();
    assert_eq!(code, 200);
    let e = handle(&mut s, &pod_route(false), &req(&Method::GET, &q, None, b"")).unwrap_err();
    assert_eq!(e.code, 404);
}

#[test]
fn nad_put_requires_resource_version() {
    let mut s = seeded();
    s.create(Resource::Nad, "a", "n", json!({"spec":{"config":"{}"}}));
    let route = Route::Object {
        res: Resource::Nad,
        ns: "a".into(),
        name: "n".into(),
        status: false,
    };
    let q = Query::default();
    let e = handle(
        &mut s,
        &route,
        &req(
            &Method::PUT,
            &q,
            Some(JSON),
            br#"{"metadata":{"name":"n"},"spec":{"config":"{\"a\":1}"}}"#,
        ),
    )
    .unwrap_err();
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("must be specified for an update"),
        "{}",
        e.message
    );
    let e = handle(
        &mut s,
        &route,
        &req(&Method::PATCH, &q, Some(STRATEGIC), b"{}"),
    )
    .unwrap_err();
    assert_eq!(e.code, 415);
}
