//! Updates (PUT) and patches: preconditions, the status/main-resource update strategies and
//! system fields.

use serde_json::{json, Value};

use super::super::patch::{json_patch, merge_patch, PatchError};
use super::super::resources::Resource;
use super::super::status::ApiError;
use super::super::store::{meta_str, set_meta, Store};
use super::super::validate;
use super::{
    check_name, check_namespace, decode_object, ApiRequest, Reply, JSON_PATCH, MERGE, STRATEGIC,
};

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

pub(super) fn update(
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

pub(super) fn patch(
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
    // A patch carries no preconditions: a UID in it is validated as an immutable field
    // (422), unlike a PUT's UID, which is a precondition (409).
    let uid = meta_str(&doc, "uid");
    if !uid.is_empty() && uid != meta_str(&old, "uid") {
        return Err(ApiError::invalid(
            res,
            name,
            "metadata.uid",
            "FieldValueInvalid",
            &format!("Invalid value: {uid:?}: field is immutable"),
        ));
    }
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
