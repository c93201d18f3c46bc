//! Label and field selectors for LIST requests.

use serde_json::Value;

use super::resources::Resource;
use super::status::ApiError;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector: all requirements must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    reqs: Vec<Req>,
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set_values(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

fn parse_eq(term: &str) -> Option<Req> {
    if let Some((k, v)) = term.split_once("!=") {
        return Some(Req::Ne(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Some(Req::Eq(k.trim().into(), v.trim().into()));
    }
    None
}

impl Selector {
    /// Parses a label selector (`a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`).
    pub fn labels(s: &str) -> Result<Selector, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top(s)
            .into_iter()
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            let req = if let Some(r) = parse_eq(term) {
                r
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                Req::NotIn(
                    k.trim().into(),
                    set_values(rest).ok_or_else(|| bad_selector(s))?,
                )
            } else if let Some((k, rest)) = term.split_once(" in ") {
                Req::In(
                    k.trim().into(),
                    set_values(rest).ok_or_else(|| bad_selector(s))?,
                )
            } else if let Some(k) = term.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else if term.contains(char::is_whitespace) || term.contains('(') {
                return Err(bad_selector(s));
            } else {
                Req::Exists(term.into())
            };
            reqs.push(req);
        }
        Ok(Selector { reqs })
    }

    /// Parses a field selector (`a=b`, `a==b`, `a!=b`), checking the fields the resource supports.
    pub fn fields(res: Resource, s: &str) -> Result<Selector, ApiError> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let req = parse_eq(term).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid field selector: invalid selector: '{s}'; can't understand '{term}'"
                ))
            })?;
            let (Req::Eq(k, _) | Req::Ne(k, _)) = &req else {
                continue;
            };
            if !field_supported(res, k) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push(req);
        }
        Ok(Selector { reqs })
    }

    /// Whether the object's labels satisfy the selector.
    pub fn matches_labels(&self, obj: &Value) -> bool {
        let labels = obj.get("metadata").and_then(|m| m.get("labels"));
        self.matches_with(|k| {
            labels
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
    }

    /// Whether the object's fields satisfy the selector.
    pub fn matches_fields(&self, obj: &Value) -> bool {
        self.matches_with(|k| Some(field_value(obj, k)))
    }

    fn matches_with(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.reqs.iter().all(|r| match r {
            Req::Eq(k, v) => get(k).as_deref() == Some(v),
            Req::Ne(k, v) => get(k).as_deref() != Some(v),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

fn bad_selector(s: &str) -> ApiError {
    ApiError::bad_request(format!(
        "unable to parse requirement: invalid label selector: {s:?}"
    ))
}

fn field_supported(res: Resource, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match res {
        Resource::Pod => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        Resource::Namespace => field == "status.phase",
        Resource::CoreEvent => {
            field.starts_with("involvedObject.")
                || matches!(field, "reason" | "reportingComponent" | "source" | "type")
        }
        Resource::Event | Resource::Nad => false,
    }
}

/// A dotted field as the string a field selector compares against ("" when absent).
fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let pod = json!({"metadata":{"labels":{"app":"x","tier":"web"}}});
        let ok = |s: &str| Selector::labels(s).unwrap().matches_labels(&pod);
        assert!(ok("app=x"));
        assert!(ok("app==x,tier"));
        assert!(!ok("app!=x"));
        assert!(ok("!missing"));
        assert!(!ok("missing"));
        assert!(ok("tier in (web,db)"));
        assert!(!ok("tier notin (web,db)"));
        assert!(ok(""));
        assert!(Selector::labels("a b").is_err());
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata":{"name":"p","namespace":"a"},"spec":{"nodeName":"n1","hostNetwork":true}});
        let ok = |s: &str| {
            Selector::fields(Resource::Pod, s)
                .unwrap()
                .matches_fields(&pod)
        };
        assert!(ok("spec.nodeName=n1"));
        assert!(ok("metadata.name=p,spec.hostNetwork=true"));
        assert!(!ok("spec.nodeName!=n1"));
        let e = Selector::fields(Resource::Pod, "spec.foo=1").unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.message, "field label not supported: spec.foo");
    }
}
