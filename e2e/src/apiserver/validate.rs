//! Validation the real apiserver applies: object names and pod spec immutability.

use serde_json::Value;

use super::resources::Resource;
use super::status::ApiError;

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// Validates an object name: DNS-1123 label for namespaces, subdomain otherwise.
pub fn name(res: Resource, name: &str) -> Result<(), ApiError> {
    let (ok, msg, max) = if res == Resource::Namespace {
        (is_label(name), LABEL_MSG, 63)
    } else {
        (is_subdomain(name), SUBDOMAIN_MSG, 253)
    };
    if ok {
        return Ok(());
    }
    let detail = if name.len() > max {
        format!("Invalid value: {name:?}: must be no more than {max} characters")
    } else {
        format!("Invalid value: {name:?}: {msg}")
    };
    Err(ApiError::invalid(
        res,
        name,
        "metadata.name",
        "FieldValueInvalid",
        &detail,
    ))
}

/// Removes nulls, empty objects and empty arrays so that equivalent encodings compare equal.
fn normalize(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Object(m) => {
            let m: serde_json::Map<String, Value> = m
                .iter()
                .filter_map(|(k, v)| normalize(v).map(|v| (k.clone(), v)))
                .collect();
            (!m.is_empty()).then_some(Value::Object(m))
        }
        Value::Array(a) => {
            let a: Vec<Value> = a
                .iter()
                .map(|v| normalize(v).unwrap_or(Value::Null))
                .collect();
            (!a.is_empty()).then_some(Value::Array(a))
        }
        other => Some(other.clone()),
    }
}

/// The spec fields an update may change, blanked out for comparison.
fn mutable_blanked(spec: Option<&Value>) -> Option<Value> {
    let mut spec = spec.cloned()?;
    if let Some(m) = spec.as_object_mut() {
        for key in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
        ] {
            m.remove(key);
        }
        for list in ["containers", "initContainers"] {
            if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("image");
                }
            }
        }
    }
    normalize(&spec)
}

/// Rejects pod updates that change immutable spec fields, like the real apiserver.
pub fn pod_spec_update(name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    if mutable_blanked(old.get("spec")) == mutable_blanked(new.get("spec")) {
        return Ok(());
    }
    Err(ApiError::invalid(
        Resource::Pod,
        name,
        "spec",
        "FieldValueForbidden",
        "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dns1123_names() {
        assert!(name(Resource::Pod, "a.b-c.0").is_ok());
        assert!(name(Resource::Namespace, "a.b").is_err());
        let e = name(Resource::Pod, "Bad_Name").unwrap_err();
        assert_eq!(e.code, 422);
        assert!(e.message.starts_with("Pod \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", e.message);
        assert!(name(Resource::Nad, "-x").is_err());
        assert!(name(Resource::Pod, &"a".repeat(254)).is_err());
        let e = name(Resource::Nad, "X").unwrap_err();
        assert!(
            e.message
                .starts_with("NetworkAttachmentDefinition.k8s.cni.cncf.io \"X\" is invalid"),
            "{}",
            e.message
        );
    }

    #[test]
    fn pod_spec_immutability() {
        let old = json!({"spec":{"containers":[{"name":"c","image":"a"}]}});
        let img = json!({"spec":{"containers":[{"name":"c","image":"b"}],"volumes":[]}});
        assert!(pod_spec_update("p", &old, &img).is_ok());
        let node = json!({"spec":{"containers":[{"name":"c","image":"a"}],"nodeName":"n"}});
        assert_eq!(pod_spec_update("p", &old, &node).unwrap_err().code, 422);
    }
}
