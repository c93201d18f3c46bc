//! The request log: one record per API request (admin `/_test` requests are not recorded).

use std::time::Duration;

use serde::{Serialize, Serializer};

/// One served request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    /// HTTP method, e.g. `PATCH`.
    pub method: String,
    /// Request path without the query.
    pub path: String,
    /// Raw query string, if any.
    pub query: Option<String>,
    /// `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// Response status code; 0 when the connection was dropped without an answer.
    pub status: u16,
    /// Time from receiving the request head to producing the response.
    #[serde(rename = "durationMs", serialize_with = "as_millis")]
    pub duration: Duration,
    /// Authenticated user, if any (never the token).
    pub user: Option<String>,
}

fn as_millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// All records in arrival order.
#[derive(Debug, Default)]
pub struct RequestLog {
    records: Vec<RequestRecord>,
}

impl RequestLog {
    /// Appends a record.
    pub fn push(&mut self, r: RequestRecord) {
        self.records.push(r);
    }

    /// A copy of all records.
    pub fn all(&self) -> Vec<RequestRecord> {
        self.records.clone()
    }

    /// Forgets all records.
    pub fn clear(&mut self) {
        self.records.clear();
    }

    /// Records with this method (case-insensitive) whose path starts with `path_prefix`.
    pub fn count(&self, method: &str, path_prefix: &str) -> usize {
        self.records
            .iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && r.path.starts_with(path_prefix))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(method: &str, path: &str) -> RequestRecord {
        RequestRecord {
            method: method.into(),
            path: path.into(),
            query: None,
            content_type: None,
            status: 200,
            duration: Duration::from_millis(3),
            user: None,
        }
    }

    #[test]
    fn counts_by_method_and_prefix() {
        let mut l = RequestLog::default();
        l.push(rec("GET", "/api/v1/namespaces/a/pods/p"));
        l.push(rec("PATCH", "/api/v1/namespaces/a/pods/p/status"));
        l.push(rec(
            "GET",
            "/apis/k8s.cni.cncf.io/v1/namespaces/a/network-attachment-definitions/n",
        ));
        assert_eq!(l.count("get", "/api/v1/"), 1);
        assert_eq!(l.count("GET", "/"), 2);
        assert_eq!(l.count("PATCH", "/api/v1/namespaces/a/pods/p/status"), 1);
        let json = serde_json::to_value(&l.all()[0]).unwrap();
        assert_eq!(json["durationMs"], 3.0);
        l.clear();
        assert!(l.all().is_empty());
    }
}
