//! The fault rules of [`super::fault_proxy`]: which requests a fault applies to
//! ([`RequestMatcher`]), added latency, and failing (an HTTP error or a dropped connection) the
//! next N matching requests, consumed in order.

use std::time::Duration;

use serde::Deserialize;

/// Which requests a fault applies to. Empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestMatcher {
    /// HTTP method (case-insensitive), e.g. `PATCH`.
    #[serde(default)]
    pub method: Option<String>,
    /// Substring the request path must contain, e.g. `/status`.
    #[serde(default)]
    pub path_contains: Option<String>,
}

impl RequestMatcher {
    /// Matches every request.
    pub fn any() -> RequestMatcher {
        RequestMatcher::default()
    }

    /// Matches requests with this method.
    pub fn method(method: &str) -> RequestMatcher {
        RequestMatcher {
            method: Some(method.to_string()),
            path_contains: None,
        }
    }

    /// Matches requests whose path contains `s`.
    pub fn path(s: &str) -> RequestMatcher {
        RequestMatcher {
            method: None,
            path_contains: Some(s.to_string()),
        }
    }

    /// Also requires the path to contain `s`.
    pub fn and_path(mut self, s: &str) -> RequestMatcher {
        self.path_contains = Some(s.to_string());
        self
    }

    /// Whether a request matches.
    pub fn matches(&self, method: &str, path: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| path.contains(p))
    }
}

/// What an injected failure does to a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Answer with this 4xx/5xx code and a `Status` body.
    Status(u16),
    /// Close the connection without any response.
    Drop,
}

#[derive(Clone, Debug)]
struct FailRule {
    remaining: u32,
    failure: Failure,
    matcher: RequestMatcher,
}

/// The active faults.
#[derive(Debug, Default)]
pub struct Faults {
    latency: Option<(Duration, RequestMatcher)>,
    failures: Vec<FailRule>,
}

impl Faults {
    /// Delays every matching request by `delay` (replaces any previous latency rule).
    pub fn set_latency(&mut self, delay: Duration, matcher: RequestMatcher) {
        self.latency = Some((delay, matcher));
    }

    /// Removes the latency rule.
    pub fn clear_latency(&mut self) {
        self.latency = None;
    }

    /// Fails the next `count` matching requests with `code`. Rules queue up in order.
    pub fn fail_next(&mut self, count: u32, code: u16, matcher: RequestMatcher) {
        self.push(count, Failure::Status(code), matcher);
    }

    /// Closes the connection of the next `count` matching requests without answering.
    pub fn drop_next(&mut self, count: u32, matcher: RequestMatcher) {
        self.push(count, Failure::Drop, matcher);
    }

    fn push(&mut self, count: u32, failure: Failure, matcher: RequestMatcher) {
        if count > 0 {
            self.failures.push(FailRule {
                remaining: count,
                failure,
                matcher,
            });
        }
    }

    /// Removes all failure rules.
    pub fn clear_failures(&mut self) {
        self.failures.clear();
    }

    /// Failures still pending across all rules.
    pub fn pending_failures(&self) -> u32 {
        self.failures.iter().map(|r| r.remaining).sum()
    }

    /// The latency for a request, if any.
    pub fn latency_for(&self, method: &str, path: &str) -> Option<Duration> {
        self.latency
            .as_ref()
            .filter(|(_, m)| m.matches(method, path))
            .map(|(d, _)| *d)
    }

    /// Consumes one failure for a request.
    pub fn take_failure(&mut self, method: &str, path: &str) -> Option<Failure> {
        let i = self
            .failures
            .iter()
            .position(|r| r.matcher.matches(method, path))?;
        let rule = &mut self.failures[i];
        rule.remaining -= 1;
        let failure = rule.failure;
        if rule.remaining == 0 {
            self.failures.remove(i);
        }
        Some(failure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_consumed_in_order_and_only_when_matching() {
        let mut f = Faults::default();
        f.fail_next(2, 503, RequestMatcher::method("patch").and_path("/status"));
        f.fail_next(1, 500, RequestMatcher::any());
        f.drop_next(1, RequestMatcher::method("DELETE"));
        assert_eq!(
            f.take_failure("PATCH", "/api/v1/namespaces/a/pods/p/status"),
            Some(Failure::Status(503))
        );
        assert_eq!(
            f.take_failure("GET", "/api/v1/namespaces/a/pods/p"),
            Some(Failure::Status(500))
        );
        assert_eq!(
            f.take_failure("DELETE", "/api/v1/namespaces/a/pods/p"),
            Some(Failure::Drop)
        );
        assert_eq!(f.take_failure("GET", "/api/v1/namespaces/a/pods/p"), None);
        assert_eq!(f.pending_failures(), 1);
        assert_eq!(
            f.take_failure("PATCH", "/x/status"),
            Some(Failure::Status(503))
        );
        assert_eq!(f.take_failure("PATCH", "/x/status"), None);
    }

    #[test]
    fn latency_only_for_matching_requests() {
        let mut f = Faults::default();
        f.set_latency(Duration::from_millis(5), RequestMatcher::path("/pods"));
        assert_eq!(
            f.latency_for("GET", "/api/v1/namespaces/a/pods"),
            Some(Duration::from_millis(5))
        );
        assert_eq!(f.latency_for("GET", "/api/v1/namespaces"), None);
        f.clear_latency();
        assert_eq!(f.latency_for("GET", "/api/v1/namespaces/a/pods"), None);
    }
}
