//! Resource handlers: create, get, list, update, patch and delete against the store, with the
//! real apiserver's preconditions, status codes and error bodies.

use http::Method;
use serde_json::{json, Value};

use super::patch::{json_patch, merge_patch, PatchError};
use super::resources::Resource;
use super::routes::{Query, Route};
use super::select::Selector;
use super::status::{delete_success, ApiError};
use super::store::{meta_str, set_meta, Store};
use super::validate;

const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const JSON: &str = "application/json";

/// A decoded API request for a resource route.
pub struct ApiRequest<'a> {
    /// HTTP method.
    pub method: &'a Method,
    /// Parsed query.
    pub query: &'a Query,
    /// Media type of the body (without parameters), if any.
    pub content_type: Option<&'a str>,
    /// Request body.
    pub body: &'a [u8],
}

/// A successful response: status code and JSON body.
pub type Reply = Result<(u16, Value), ApiError>;

/// The authorization verb for a request, or `None` when the method is not served on the route.
pub fn verb(method: &Method, route: &Route, query: &Query) -> Option<&'static str> {
    match route {
        Route::Collection { .. } => match *method {
            Method::GET if query.flag("watch") => Some("watch"),
            Method::GET => Some("list"),
            Method::POST => Some("create"),
            Method::DELETE => Some("deletecollection"),
            _ => None,
        },
        Route::Object { .. } => match *method {
            Method::GET => Some("get"),
            Method::PUT => Some("update"),
            Method::PATCH => Some("patch"),
            Method::DELETE => Some("delete"),
            _ => None,
        },
        _ => None,
    }
}

/// Serves a collection or object route.
pub fn handle(store: &mut Store, route: &Route, req: &ApiRequest<'_>) -> Reply {
    if req.query.get("dryRun").is_some() {
        return Err(ApiError::bad_request(
            "dryRun is not supported by plexus-test-apiserver",
        ));
    }
    match route {
        Route::Collection { res, ns } => match *req.method {
            Method::GET if req.query.flag("watch") => Err(ApiError::method_not_allowed(
                "watch is not supported by plexus-test-apiserver",
            )),
            Method::GET => list(store, *res, ns.as_deref(), req.query),
            Method::POST => match ns {
                Some(ns) => create(store, *res, ns, req),
                None if !res.namespaced() => create(store, *res, "", req),
                None => Err(ApiError::method_not_supported()),
            },
            _ => Err(ApiError::method_not_supported()),
        },
        Route::Object {
            res,
            ns,
            name,
            status,
        } => {
            let res = *res;
            match *req.method {
                Method::GET => store
                    .get(res, ns, name)
                    .map(|o| (200, o.clone()))
                    .ok_or_else(|| ApiError::not_found(res, name)),
                _ if res == Resource::Namespace => Err(ApiError::method_not_supported()),
                Method::PUT => update(store, res, ns, name, *status, req),
                Method::PATCH => patch(store, res, ns, name, *status, req),
                Method::DELETE if !status => delete(store, res, ns, name, req),
                _ => Err(ApiError::method_not_supported()),
            }
        }
        _ => Err(ApiError::no_route()),
    }
}

fn list(store: &Store, res: Resource, ns: Option<&str>, q: &Query) -> Reply {
    let labels = Selector::labels(q.get("labelSelector").unwrap_or(""))?;
    let fields = Selector::fields(res, q.get("fieldSelector").unwrap_or(""))?;
    let items: Vec<Value> = store
        .list(res, ns)
        .into_iter()
        .filter(|o| labels.matches_labels(o) && fields.matches_fields(o))
        .map(|o| {
            let mut o = o.clone();
            if res.builtin() {
                if let Some(m) = o.as_object_mut() {
                    m.remove("kind");
                    m.remove("apiVersion");
                }
            }
            o
        })
        .collect();
    Ok((
        200,
        json!({
            "kind": format!("{}List", res.kind()),
            "apiVersion": res.api_version(),
            "metadata": { "resourceVersion": store.resource_version().to_string() },
            "items": items,
        }),
    ))
}

/// Decodes a JSON object body for create/update and checks its apiVersion and kind.
fn decode_object(res: Resource, req: &ApiRequest<'_>) -> Result<Value, ApiError> {
    if req.content_type != Some(JSON) {
        return Err(ApiError::unsupported_media_type(&[JSON]));
    }
    let obj: Value = serde_json::from_slice(req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding body: {e}")))?;
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "error decoding body: expected a JSON object",
        ));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
        if av != res.api_version() {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                res.api_version()
            )));
        }
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str) {
        if kind != res.kind() {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                res.kind()
            )));
        }
    }
    Ok(obj)
}

fn check_namespace(obj: &Value, ns: &str) -> Result<(), ApiError> {
    let got = meta_str(obj, "namespace");
    if !got.is_empty() && got != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

fn check_name(obj: &Value, name: &str) -> Result<(), ApiError> {
    let got = meta_str(obj, "name");
    if !got.is_empty() && got != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({got}) does not match the name on the URL ({name})"
        )));
    }
    Ok(())
}

fn create(store: &mut Store, res: Resource, ns: &str, req: &ApiRequest<'_>) -> Reply {
    let mut obj = decode_object(res, req)?;
    check_namespace(&obj, ns)?;
    let mut name = meta_str(&obj, "name").to_string();
    if name.is_empty() {
        let prefix = meta_str(&obj, "generateName");
        if prefix.is_empty() {
            return Err(ApiError::invalid(
                res,
                "",
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            ));
        }
        name = format!("{prefix}{}", store.name_suffix());
    }
    validate::name(res, &name)?;
    if res.namespaced() && !store.namespace_exists(ns) {
        return Err(ApiError::not_found(Resource::Namespace, ns));
    }
    if store.get(res, ns, &name).is_some() {
        return Err(ApiError::already_exists(res, &name));
    }
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        for system in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
        ] {
            meta.remove(system);
        }
    }
    apply_create_defaults(res, &name, &mut obj);
    Ok((201, store.create(res, ns, &name, obj)))
}

/// Defaults the real apiserver applies on create.
pub fn apply_create_defaults(res: Resource, name: &str, obj: &mut Value) {
    match res {
        Resource::Pod => obj["status"] = json!({ "phase": "Pending" }),
        Resource::Namespace => {
            obj["spec"] = json!({ "finalizers": ["kubernetes"] });
            obj["status"] = json!({ "phase": "Active" });
            if !obj["metadata"].get("labels").is_some_and(Value::is_object) {
                obj["metadata"]["labels"] = json!({});
            }
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        Resource::Nad => set_meta(obj, "generation", json!(1)),
        Resource::CoreEvent | Resource::Event => {}
    }
}

/// The uid precondition, then the optimistic-lock resourceVersion check.
fn check_preconditions(
    res: Resource,
    ns: &str,
    name: &str,
    old: &Value,
    new: &Value,
    require_rv: bool,
) -> Result<(), ApiError> {
    let (uid, old_uid) = (meta_str(new, "uid"), meta_str(old, "uid"));
    if !uid.is_empty() && uid != old_uid {
        return Err(ApiError::precondition(
            res,
            ns,
            name,
            &format!("UID in precondition: {uid}, UID in object meta: {old_uid}"),
        ));
    }
    let rv = meta_str(new, "resourceVersion");
    if rv.is_empty() {
        if require_rv {
            return Err(ApiError::invalid_as(
                &res.qualified(),
                res,
                name,
                "metadata.resourceVersion",
                "FieldValueInvalid",
                "Invalid value: 0x0: must be specified for an update",
            ));
        }
    } else if rv != meta_str(old, "resourceVersion") {
        return Err(ApiError::conflict(res, name));
    }
    Ok(())
}

fn update(
    store: &mut Store,
    res: Resource,
    ns: &str,
    name: &str,
    status: bool,
    req: &ApiRequest<'_>,
) -> Reply {
    let obj = decode_object(res, req)?;
    check_name(&obj, name)?;
    check_namespace(&obj, ns)?;
    let old = store
        .get(res, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(res, name))?;
    check_preconditions(
        res,
        ns,
        name,
        &old,
        &obj,
        !res.allows_unconditional_update(),
    )?;
    commit_update(store, res, ns, name, old, obj, status)
}

fn patch(
    store: &mut Store,
    res: Resource,
    ns: &str,
    name: &str,
    status: bool,
    req: &ApiRequest<'_>,
) -> Reply {
    let accepted: &[&str] = if res.builtin() {
        &[JSON_PATCH, MERGE, STRATEGIC]
    } else {
        &[JSON_PATCH, MERGE]
    };
    let ct = req
        .content_type
        .filter(|ct| accepted.contains(ct))
        .ok_or_else(|| ApiError::unsupported_media_type(accepted))?;
    let old = store
        .get(res, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(res, name))?;
    let patch: Value = serde_json::from_slice(req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let mut doc = old.clone();
    if ct == JSON_PATCH {
        json_patch(&mut doc, &patch).map_err(|e| match e {
            PatchError::Decode(m) => ApiError::bad_request(m),
            PatchError::Apply(m) => ApiError::patch_not_applicable(&m),
        })?;
    } else {
        // Strategic merge patch is treated as a merge patch: exact for maps such as
        // annotations and labels, not for lists with merge keys.
        if !patch.is_object() {
            return Err(ApiError::bad_request(
                "error decoding patch: the patch is not a JSON object",
            ));
        }
        merge_patch(&mut doc, &patch);
    }
    if !doc.is_object() {
        return Err(ApiError::bad_request(
            "the patched object is not a JSON object",
        ));
    }
    check_name(&doc, name)?;
    check_namespace(&doc, ns)?;
    check_preconditions(res, ns, name, &old, &doc, false)?;
    commit_update(store, res, ns, name, old, doc, status)
}

/// Applies the update strategy (status vs main resource), keeps system fields and stores.
fn commit_update(
    store: &mut Store,
    res: Resource,
    ns: &str,
    name: &str,
    old: Value,
    new: Value,
    status: bool,
) -> Reply {
    let mut out = if status {
        // The status subresource takes only status, labels and annotations.
        let mut out = old.clone();
        copy_field(&mut out, &new, &["status"]);
        copy_field(&mut out, &new, &["metadata", "labels"]);
        copy_field(&mut out, &new, &["metadata", "annotations"]);
        out
    } else {
        let mut out = new;
        if res.has_status() {
            copy_field(&mut out, &old, &["status"]);
        }
        if res == Resource::Pod {
            validate::pod_spec_update(name, &old, &out)?;
        }
        out
    };
    out["apiVersion"] = json!(res.api_version());
    out["kind"] = json!(res.kind());
    for system in [
        "uid",
        "creationTimestamp",
        "name",
        "namespace",
        "generation",
        "deletionTimestamp",
    ] {
        let v = old.get("metadata").and_then(|m| m.get(system)).cloned();
        match v {
            Some(v) => set_meta(&mut out, system, v),
            None => {
                if let Some(m) = out.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove(system);
                }
            }
        }
    }
    set_meta(
        &mut out,
        "resourceVersion",
        old["metadata"]["resourceVersion"].clone(),
    );
    if out == old {
        // A no-op update is not written and keeps its resourceVersion, as in the real apiserver.
        return Ok((200, old));
    }
    if res == Resource::Nad && without_meta(&out) != without_meta(&old) {
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        set_meta(&mut out, "generation", json!(generation));
    }
    Ok((200, store.update(res, ns, name, out)))
}

fn without_meta(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
    }
    v
}

/// Sets `dst[path] = src[path]`, removing it from `dst` when `src` lacks it.
fn copy_field(dst: &mut Value, src: &Value, path: &[&str]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let value = path.iter().try_fold(src, |v, k| v.get(*k)).cloned();
    let mut cur = dst;
    for p in parents {
        if !cur.get(*p).is_some_and(Value::is_object) {
            if value.is_none() {
                return;
            }
            cur[*p] = json!({});
        }
        cur = &mut cur[*p];
    }
    if let Some(m) = cur.as_object_mut() {
        match value {
            Some(v) => {
                m.insert((*last).to_string(), v);
            }
            None => {
                m.remove(*last);
            }
        }
    }
}

fn delete(store: &mut Store, res: Resource, ns: &str, name: &str, req: &ApiRequest<'_>) -> Reply {
    let old = store
        .get(res, ns, name)
        .cloned()
        .ok_or_else(|| ApiError::not_found(res, name))?;
    if !req.body.is_empty() {
        let opts: Value = serde_json::from_slice(req.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding body: {e}")))?;
        let pre = &opts["preconditions"];
        if let Some(uid) = pre.get("uid").and_then(Value::as_str) {
            let old_uid = meta_str(&old, "uid");
            if uid != old_uid {
                return Err(ApiError::precondition(
                    res,
                    ns,
                    name,
                    &format!("UID in precondition: {uid}, UID in object meta: {old_uid}"),
                ));
            }
        }
        if let Some(rv) = pre.get("resourceVersion").and_then(Value::as_str) {
            let old_rv = meta_str(&old, "resourceVersion");
            if rv != old_rv {
                return Err(ApiError::precondition(
                    res,
                    ns,
                    name,
                    &format!(
                        "ResourceVersion in precondition: {rv}, ResourceVersion in meta: {old_rv}"
                    ),
                ));
            }
        }
    }
    store.delete(res, ns, name);
    if res == Resource::Pod {
        // Pods answer with the object itself; it is removed at once (no kubelet to wait for).
        Ok((200, old))
    } else {
        Ok((200, delete_success(res, name, meta_str(&old, "uid"))))
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        assert!(
            e.message
                .contains("Precondition failed: UID in precondition: zzz, UID in object meta: "),
            "{}",
            e.message
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
}
