//! Validation the real apiserver applies: object names, pod spec immutability and core/v1
//! Event fields.

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

/// Length limits of core/v1 Event fields (k8s.io/kubernetes pkg/apis/core/validation/events.go).
const EVENT_FIELD_MAX: usize = 128;
const EVENT_NOTE_MAX: usize = 1024;

/// Validates a core/v1 Event on create as the apiserver does (`legacyValidateEvent`): an
/// event without `eventTime` only needs `involvedObject.namespace` to match; one with
/// `eventTime` (a "new-style" event) must also carry `reportingComponent`, `reportingInstance`,
/// `action` and `reason`, within their length limits.
pub fn core_event(ns: &str, name: &str, ev: &Value) -> Result<(), ApiError> {
    let s = |k: &str| ev.get(k).and_then(Value::as_str).unwrap_or("");
    let involved_ns = ev["involvedObject"]["namespace"].as_str().unwrap_or("");
    let mut errs: Vec<(&str, &str, String)> = Vec::new();
    let ns_mismatch = (
        "involvedObject.namespace",
        "FieldValueInvalid",
        format!("Invalid value: {involved_ns:?}: does not match event.namespace"),
    );
    if s("eventTime").is_empty() {
        let ok = if involved_ns.is_empty() {
            ns.is_empty() || ns == "default"
        } else {
            involved_ns == ns
        };
        if !ok {
            errs.push(ns_mismatch);
        }
    } else {
        if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
            errs.push(ns_mismatch);
        }
        let required = |field: &'static str, errs: &mut Vec<(&str, &str, String)>| {
            if s(field).is_empty() {
                errs.push((field, "FieldValueRequired", "Required value".into()));
            }
        };
        let at_most = |field: &'static str, max: usize, errs: &mut Vec<(&str, &str, String)>| {
            if s(field).len() > max {
                errs.push((
                    field,
                    "FieldValueInvalid",
                    format!("Invalid value: \"\": can have at most {max} characters"),
                ));
            }
        };
        required("reportingComponent", &mut errs);
        required("reportingInstance", &mut errs);
        at_most("reportingInstance", EVENT_FIELD_MAX, &mut errs);
        required("action", &mut errs);
        at_most("action", EVENT_FIELD_MAX, &mut errs);
        required("reason", &mut errs);
        at_most("reason", EVENT_FIELD_MAX, &mut errs);
        at_most("message", EVENT_NOTE_MAX, &mut errs);
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_fields(Resource::CoreEvent, name, &errs))
    }
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
    fn core_events_with_event_time_need_the_new_style_fields() {
        let old = json!({"involvedObject":{"namespace":"a"},"reason":"R"});
        assert!(core_event("a", "e", &old).is_ok());
        let e = core_event("b", "e", &old).unwrap_err();
        assert!(
            e.message.contains("involvedObject.namespace"),
            "{}",
            e.message
        );
        // What plexus posted before issue 7: eventTime without action.
        let mut new = json!({"involvedObject":{"namespace":"a"},"eventTime":"2026-01-01T00:00:00.000000Z",
            "reportingComponent":"plexus","reportingInstance":"n1","reason":"AddedInterface"});
        let e = core_event("a", "p.1", &new).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(e.reason, "Invalid");
        assert_eq!(
            e.message,
            "Event \"p.1\" is invalid: action: Required value"
        );
        new["action"] = json!("CNIAdd");
        assert!(core_event("a", "p.1", &new).is_ok());
        new["reportingInstance"] = json!("");
        new["action"] = json!("x".repeat(129));
        let e = core_event("a", "p.1", &new).unwrap_err();
        assert!(
            e.message.starts_with("Event \"p.1\" is invalid: [reportingInstance: Required value, action: Invalid value"),
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
