//! `apiserver_request_total` from the apiserver's `/metrics`, summed by (verb, resource,
//! subresource). The metric is not per user: count deltas around one call with nothing else
//! running, and only for the resources of interest.

use std::collections::BTreeMap;

/// Which requests a counter is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestKey {
    /// Upper-case verb as the apiserver reports it (`GET`, `LIST`, `PATCH`, `POST`, …).
    pub verb: String,
    /// Resource (`pods`, `events`, `network-attachment-definitions`; empty for non-resource URLs).
    pub resource: String,
    /// Subresource (`status`, `token`, or empty).
    pub subresource: String,
}

impl RequestKey {
    /// A key from its parts.
    pub fn new(verb: &str, resource: &str, subresource: &str) -> RequestKey {
        RequestKey {
            verb: verb.into(),
            resource: resource.into(),
            subresource: subresource.into(),
        }
    }
}

impl std::fmt::Display for RequestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        Ok(())
    }
}

/// Request counts by key.
pub type RequestCounts = BTreeMap<RequestKey, u64>;

/// A sample line after its metric name and `{`: its (verb, resource, subresource) and value.
fn sample(rest: &str) -> Option<(RequestKey, f64)> {
    let (labels, value) = rest.rsplit_once("} ")?;
    let value = value.trim().parse::<f64>().ok()?;
    let key = RequestKey::new(
        label(labels, "verb"),
        label(labels, "resource"),
        label(labels, "subresource"),
    );
    Some((key, value))
}

/// Sum `apiserver_request_total` of a Prometheus text exposition by key (all codes).
pub fn parse_request_totals(text: &str) -> RequestCounts {
    let mut out = RequestCounts::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((key, value)) = sample(rest) else {
            continue;
        };
        *out.entry(key).or_default() += value as u64;
    }
    out
}

/// Mean server-side latency (seconds) per key: `apiserver_request_duration_seconds_sum` over
/// `_count`, summed over the other labels. What the apiserver itself spent on each kind of
/// request (from reading it to writing the answer), without the client's share.
pub fn parse_mean_durations(text: &str) -> BTreeMap<RequestKey, f64> {
    let mut sums: BTreeMap<RequestKey, (f64, f64)> = BTreeMap::new();
    for line in text.lines() {
        let (rest, is_sum) =
            if let Some(r) = line.strip_prefix("apiserver_request_duration_seconds_sum{") {
                (r, true)
            } else if let Some(r) = line.strip_prefix("apiserver_request_duration_seconds_count{") {
                (r, false)
            } else {
                continue;
            };
        let Some((key, value)) = sample(rest) else {
            continue;
        };
        let e = sums.entry(key).or_default();
        if is_sum {
            e.0 += value;
        } else {
            e.1 += value;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, n))| *n > 0.0)
        .map(|(k, (s, n))| (k, s / n))
        .collect()
}

/// The value of `name="…"` in a label set (label values here never contain quotes or commas).
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim_matches('"'))
        .unwrap_or("")
}

/// `after - before`, only non-zero entries whose resource is in `resources`.
pub fn delta(before: &RequestCounts, after: &RequestCounts, resources: &[&str]) -> RequestCounts {
    after
        .iter()
        .filter(|(k, _)| resources.contains(&k.resource.as_str()))
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_codes_and_keys_by_verb_resource_subresource() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 3
apiserver_request_total{code="422",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 2
apiserver_request_total_other{verb="GET"} 9
"#;
        let c = parse_request_totals(text);
        assert_eq!(c[&RequestKey::new("PATCH", "pods", "status")], 4);
        assert_eq!(c[&RequestKey::new("GET", "pods", "")], 2);
        assert_eq!(c.len(), 2);
        let mut after = c.clone();
        *after.get_mut(&RequestKey::new("GET", "pods", "")).unwrap() += 1;
        let d = delta(&c, &after, &["pods"]);
        assert_eq!(d.len(), 1);
        assert_eq!(d[&RequestKey::new("GET", "pods", "")], 1);
        assert!(delta(&c, &after, &["events"]).is_empty());
    }

    #[test]
    fn mean_durations_divide_sum_by_count_per_key() {
        let text = r#"apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="0.005"} 3
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 0.012
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 4
apiserver_request_duration_seconds_sum{component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 1
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 0
"#;
        let m = parse_mean_durations(text);
        assert!((m[&RequestKey::new("PATCH", "pods", "status")] - 0.003).abs() < 1e-9);
        assert_eq!(m.len(), 1, "a key without requests has no mean");
    }
}
