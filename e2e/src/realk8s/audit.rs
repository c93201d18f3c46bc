//! The apiserver's audit log (JSON lines, level Metadata, stage ResponseComplete): exactly
//! which user made which request, with the response code.

use std::path::Path;

use serde_json::Value;

/// The audit policy the control plane runs with: every request at level Metadata, once.
pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
";

/// One audited request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditEntry {
    /// `user.username`, e.g. `system:serviceaccount:kube-system:plexus`.
    pub user: String,
    /// Lower-case Kubernetes verb (`get`, `list`, `patch`, `create`, `watch`, …).
    pub verb: String,
    /// API group (`""` for core).
    pub group: String,
    /// Resource (empty for non-resource URLs).
    pub resource: String,
    /// Subresource or empty.
    pub subresource: String,
    /// Namespace or empty.
    pub namespace: String,
    /// Object name or empty.
    pub name: String,
    /// HTTP status code of the response.
    pub code: u16,
    /// Request URI.
    pub uri: String,
}

/// Every ResponseComplete/Panic entry of the log at `path` (missing file: none).
pub fn read(path: &Path) -> Vec<AuditEntry> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<AuditEntry> {
    let v: Value = serde_json::from_str(line).ok()?;
    if v["stage"] == "RequestReceived" {
        return None;
    }
    let s = |x: &Value| x.as_str().unwrap_or("").to_string();
    let obj = &v["objectRef"];
    Some(AuditEntry {
        user: s(&v["user"]["username"]),
        verb: s(&v["verb"]),
        group: s(&obj["apiGroup"]),
        resource: s(&obj["resource"]),
        subresource: s(&obj["subresource"]),
        namespace: s(&obj["namespace"]),
        name: s(&obj["name"]),
        code: v["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
        uri: s(&v["requestURI"]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_response_complete_entry_and_skips_request_received() {
        let ok = r#"{"kind":"Event","level":"Metadata","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/a/pods/p/status","verb":"patch","user":{"username":"system:serviceaccount:kube-system:plexus"},"objectRef":{"resource":"pods","namespace":"a","name":"p","apiVersion":"v1","subresource":"status"},"responseStatus":{"code":200}}"#;
        let rr = r#"{"stage":"RequestReceived","verb":"get"}"#;
        let e = parse_line(ok).unwrap();
        assert_eq!(e.user, "system:serviceaccount:kube-system:plexus");
        assert_eq!(
            (e.verb.as_str(), e.group.as_str(), e.resource.as_str()),
            ("patch", "", "pods")
        );
        assert_eq!((e.subresource.as_str(), e.code), ("status", 200));
        assert!(parse_line(rr).is_none());
        assert!(parse_line("not json").is_none());
    }
}
