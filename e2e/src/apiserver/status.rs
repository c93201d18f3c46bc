//! Kubernetes `Status` error bodies with the real reasons, messages and codes.

use serde_json::{json, Value};

use super::resources::Resource;

/// An API error answered as a `metav1.Status` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `code` in the body).
    pub code: u16,
    /// `reason` in the body; empty means no reason.
    pub reason: &'static str,
    /// `message` in the body.
    pub message: String,
    /// `details` in the body, if any.
    pub details: Option<Value>,
}

fn details(res: Resource, name: &str) -> Value {
    let mut d = json!({ "name": name });
    if !res.group().is_empty() {
        d["group"] = json!(res.group());
    }
    d["kind"] = json!(res.plural());
    d
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, d: Value) -> ApiError {
        self.details = Some(d);
        self
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(res: Resource, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
        )
        .with_details(details(res, name))
    }

    /// 404 for a path the server does not serve.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    /// 409 `pods "x" already exists`.
    pub fn already_exists(res: Resource, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified()),
        )
        .with_details(details(res, name))
    }

    /// 409 optimistic-lock conflict (stale resourceVersion).
    pub fn conflict(res: Resource, name: &str) -> ApiError {
        Self::conflict_with(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 precondition failure as produced by the storage layer (uid or resourceVersion).
    pub fn precondition(res: Resource, ns: &str, name: &str, what: &str) -> ApiError {
        let key = if ns.is_empty() {
            format!("/registry/{}/{name}", res.qualified())
        } else {
            format!("/registry/{}/{ns}/{name}", res.qualified())
        };
        Self::conflict_with(
            res,
            name,
            &format!(
                "StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: {what}"
            ),
        )
    }

    fn conflict_with(res: Resource, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                res.qualified()
            ),
        )
        .with_details(details(res, name))
    }

    /// 422 `Pod "x" is invalid: field: detail` with one cause.
    pub fn invalid(
        res: Resource,
        name: &str,
        field: &str,
        cause_reason: &str,
        detail: &str,
    ) -> ApiError {
        Self::invalid_as(
            &res.qualified_kind(),
            res,
            name,
            field,
            cause_reason,
            detail,
        )
    }

    /// 422 with every field error, as the apiserver aggregates them: one error reads
    /// `Event "x" is invalid: action: Required value`, several `… is invalid: [a: …, b: …]`.
    /// Each error is (field, cause reason, detail).
    pub fn invalid_fields(res: Resource, name: &str, errs: &[(&str, &str, String)]) -> ApiError {
        let texts: Vec<String> = errs.iter().map(|(f, _, d)| format!("{f}: {d}")).collect();
        let text = match texts.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut d = json!({ "name": name });
        if !res.group().is_empty() {
            d["group"] = json!(res.group());
        }
        d["kind"] = json!(res.kind());
        d["causes"] = errs
            .iter()
            .map(|(f, r, m)| json!({ "reason": r, "message": m, "field": f }))
            .collect();
        ApiError::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {text}", res.qualified_kind()),
        )
        .with_details(d)
    }

    /// 422 like [`ApiError::invalid`] but naming the qualified resource instead of the kind
    /// (the storage layer does this for a missing resourceVersion).
    pub fn invalid_as(
        qualified: &str,
        res: Resource,
        name: &str,
        field: &str,
        cause_reason: &str,
        detail: &str,
    ) -> ApiError {
        let mut d = json!({ "name": name });
        if !res.group().is_empty() {
            d["group"] = json!(res.group());
        }
        d["kind"] = json!(if qualified.starts_with(res.kind()) {
            res.kind()
        } else {
            res.plural()
        });
        d["causes"] = json!([{ "reason": cause_reason, "message": detail, "field": field }]);
        ApiError::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {field}: {detail}"),
        )
        .with_details(d)
    }

    /// 422 from a JSON patch that does not apply (the apiserver wraps the patch library error).
    pub fn patch_not_applicable(why: &str) -> ApiError {
        ApiError::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
        .with_details(
            json!({ "causes": [{ "reason": "UnexpectedServerResponse", "message": why }] }),
        )
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden with the RBAC authorizer's message.
    pub fn forbidden(
        res: Resource,
        sub: Option<&str>,
        name: Option<&str>,
        ns: Option<&str>,
        user: &str,
        verb: &str,
    ) -> ApiError {
        let subject = match name {
            Some(n) => format!("{} \"{n}\"", res.qualified()),
            None => res.qualified(),
        };
        let resource = match sub {
            Some(s) => format!("{}/{s}", res.plural()),
            None => res.plural().to_string(),
        };
        let scope = match ns {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        ApiError::new(
            403,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}",
                res.group()
            ),
        )
        .with_details(details(res, name.unwrap_or("")))
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    /// 405 for a method the resource does not serve.
    pub fn method_not_supported() -> ApiError {
        Self::method_not_allowed("the server does not allow this method on the requested resource")
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(413, "RequestEntityTooLarge", message)
    }

    /// 415 UnsupportedMediaType for a content type the server cannot decode.
    pub fn unsupported_media_type(accepted: &[&str]) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// The `Status` body.
    pub fn body(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        });
        if !self.reason.is_empty() {
            v["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v["code"] = json!(self.code);
        v
    }
}

/// A `Status` body reporting success of a delete.
pub fn delete_success(res: Resource, name: &str, uid: &str) -> Value {
    let mut d = details(res, name);
    d["uid"] = json!(uid);
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": d,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_body_matches_real_apiserver() {
        let body = ApiError::not_found(Resource::Pod, "x").body();
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"pods"},"code":404}"#
        );
    }

    #[test]
    fn forbidden_message_matches_rbac() {
        let e = ApiError::forbidden(
            Resource::Pod,
            Some("status"),
            Some("x"),
            Some("ns"),
            "u",
            "patch",
        );
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            r#"pods "x" is forbidden: User "u" cannot patch resource "pods/status" in API group "" in the namespace "ns""#
        );
        let e = ApiError::forbidden(Resource::Namespace, None, None, None, "u", "list");
        assert_eq!(
            e.message,
            r#"namespaces is forbidden: User "u" cannot list resource "namespaces" in API group "" at the cluster scope"#
        );
    }

    #[test]
    fn crd_errors_are_group_qualified() {
        let e = ApiError::conflict(Resource::Nad, "n");
        assert!(e
            .message
            .starts_with(r#"Operation cannot be fulfilled on network-attachment-definitions.k8s.cni.cncf.io "n": "#));
        assert_eq!(e.details.unwrap()["group"], "k8s.cni.cncf.io");
    }
}
