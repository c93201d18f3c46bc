//! Resource handlers: create, get, list, update, patch and delete against the store, with the
//! real apiserver's preconditions, status codes and error bodies.

use http::Method;
use serde_json::{json, Value};

use super::resources::Resource;
use super::routes::{Query, Route};
use super::select::Selector;
use super::status::{delete_success, ApiError};
use super::store::{meta_str, set_meta, Store};
use super::validate;

#[cfg(test)]
mod tests;
mod update;

use update::{patch, update};

pub(super) const MERGE: &str = "application/merge-patch+json";
pub(super) const STRATEGIC: &str = "application/strategic-merge-patch+json";
pub(super) const JSON_PATCH: &str = "application/json-patch+json";
pub(super) const JSON: &str = "application/json";

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
pub(super) fn decode_object(res: Resource, req: &ApiRequest<'_>) -> Result<Value, ApiError> {
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

pub(super) fn check_namespace(obj: &Value, ns: &str) -> Result<(), ApiError> {
    let got = meta_str(obj, "namespace");
    if !got.is_empty() && got != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

pub(super) fn check_name(obj: &Value, name: &str) -> Result<(), ApiError> {
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
    if res == Resource::CoreEvent {
        validate::core_event(ns, &name, &obj)?;
    }
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
