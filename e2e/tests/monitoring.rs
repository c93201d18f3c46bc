//! deploy/monitoring: the alert rules pass `promtool check rules` and `promtool test rules`
//! (series that fire each alert and series that must not; a copy with loosened thresholds must
//! fail the same tests), the operator's PrometheusRule is the plain rule file, and every metric
//! name in the rules and the dashboard is one plexus registers (meta/src/daemon/metrics.rs, both
//! modes' registry) or one of the few external series named in [`EXTERNAL`]; the real tier
//! (real_metrics.rs) queries the names a real Prometheus scraped.
//!
//! promtool is Debian's (`apt-get install prometheus`, 2.42) or `PLEXUS_PROMTOOL`; without it the
//! promtool tests print why and pass, unless `PLEXUS_PROMETHEUS_REQUIRE` is set (CI).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Series the rules and the dashboard read that plexus does not export: Prometheus' scrape
/// health and kube-state-metrics' pod readiness.
const EXTERNAL: [&str; 2] = ["up", "kube_pod_status_ready"];

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// promtool, or `None` (skip, with a message) when absent and not required.
fn promtool() -> Option<PathBuf> {
    let candidates = std::env::var_os("PLEXUS_PROMTOOL")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/usr/bin/promtool".into(), "/usr/local/bin/promtool".into()]);
    for c in candidates {
        if c.is_file() {
            return Some(c);
        }
    }
    let required = std::env::var_os("PLEXUS_PROMETHEUS_REQUIRE").is_some_and(|v| !v.is_empty());
    assert!(
        !required,
        "PLEXUS_PROMETHEUS_REQUIRE is set and there is no promtool (apt-get install prometheus, or PLEXUS_PROMTOOL)"
    );
    eprintln!("skipped: no promtool (apt-get install prometheus, or set PLEXUS_PROMTOOL)");
    None
}

fn run(promtool: &Path, dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn rules_pass_promtool_check_and_unit_tests() {
    let Some(promtool) = promtool() else { return };
    let rules = monitoring_dir().join("rules");
    let (ok, out) = run(&promtool, &rules, &["check", "rules", "plexus.rules.yaml"]);
    assert!(ok, "promtool check rules: {out}");
    assert!(out.contains("SUCCESS: 7 rules found"), "{out}");
    let (ok, out) = run(
        &promtool,
        &rules,
        &["test", "rules", "plexus.rules.test.yaml"],
    );
    assert!(ok, "promtool test rules: {out}");
    // The PrometheusRule too: promtool reads its spec when it is the only document.
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = prometheusrule_spec();
    std::fs::write(dir.path().join("spec.yaml"), spec).expect("write");
    let (ok, out) = run(&promtool, dir.path(), &["check", "rules", "spec.yaml"]);
    assert!(ok, "promtool check rules (PrometheusRule spec): {out}");
}

/// The unit tests tell firing from not firing: each threshold loosened or tightened in a copy
/// of the rules makes `promtool test rules` fail on that alert.
#[test]
fn rule_tests_fail_when_a_threshold_changes() {
    let Some(promtool) = promtool() else { return };
    let rules =
        std::fs::read_to_string(monitoring_dir().join("rules/plexus.rules.yaml")).expect("rules");
    let tests = std::fs::read_to_string(monitoring_dir().join("rules/plexus.rules.test.yaml"))
        .expect("rule tests");
    let mutations = [
        ("PlexusCniAddFailuresRising", ") > 0.1", ") > 0.5"),
        ("PlexusCniAddLatencyHigh", "[10m]))) > 5", "[10m]))) > 10"),
        (
            "PlexusStatusWritesGivenUp",
            "increase(plexus_status_writes_given_up_total[15m]) > 0",
            "increase(plexus_status_writes_given_up_total[15m]) > 5",
        ),
        (
            "PlexusSriovVfPoolExhausted",
            "state=\"free\"}) == 0",
            "state=\"free\"}) <= 1",
        ),
        ("PlexusMetricsDown", "plexus\"} == 0", "plexus\"} == 1"),
        ("PlexusPodNotReady", "-.*\"}) == 0", "-.*\"}) == 1"),
        (
            "PlexusAddressClaimConflicts",
            "increase(plexus_address_claim_conflicts_total[15m]) > 0",
            "increase(plexus_address_claim_conflicts_total[15m]) > 2",
        ),
    ];
    for (alert, from, to) in mutations {
        assert_eq!(
            rules.matches(from).count(),
            1,
            "{alert}: {from:?} not once in the rules"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("plexus.rules.yaml"),
            rules.replace(from, to),
        )
        .expect("write");
        std::fs::write(dir.path().join("plexus.rules.test.yaml"), &tests).expect("write");
        let (ok, out) = run(
            &promtool,
            dir.path(),
            &["test", "rules", "plexus.rules.test.yaml"],
        );
        assert!(!ok, "{alert} with {to:?}: the tests still pass:\n{out}");
        assert!(
            out.contains(&format!("alertname: {alert}")),
            "{alert}: {out}"
        );
    }
}

/// prometheus-rules.yaml's `spec:`, un-indented: the groups of the plain rule file.
fn prometheusrule_spec() -> String {
    let text = std::fs::read_to_string(monitoring_dir().join("prometheus-rules.yaml"))
        .expect("prometheus-rules.yaml");
    let (_, spec) = text.split_once("\nspec:\n").expect("a spec: line");
    spec.lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn the_prometheusrule_is_the_plain_rule_file() {
    let text = std::fs::read_to_string(monitoring_dir().join("prometheus-rules.yaml"))
        .expect("prometheus-rules.yaml");
    for line in [
        "apiVersion: monitoring.coreos.com/v1",
        "kind: PrometheusRule",
    ] {
        assert!(text.contains(line), "prometheus-rules.yaml: no {line:?}");
    }
    let plain =
        std::fs::read_to_string(monitoring_dir().join("rules/plexus.rules.yaml")).expect("rules");
    let groups = &plain[plain.find("\ngroups:").expect("groups:") + 1..];
    assert_eq!(
        prometheusrule_spec(),
        groups,
        "deploy/monitoring/prometheus-rules.yaml is out of date: run deploy/monitoring/gen-prometheusrule.sh"
    );
}

/// The base names plexus registers (`plexus_` + the first argument of every
/// `registry.register(` in meta/src/daemon/metrics.rs and metrics/*.rs, the one registry both
/// modes export). Read from the source: an empty family (no series yet) has no `# TYPE` line
/// in the encoded text.
fn registered() -> BTreeSet<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../meta/src/daemon");
    let mut files = vec![dir.join("metrics.rs")];
    if let Ok(rd) = std::fs::read_dir(dir.join("metrics")) {
        files.extend(rd.flatten().map(|e| e.path()));
    }
    let mut names = BTreeSet::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let text = std::fs::read_to_string(f).expect("metrics source");
        for (i, _) in text.match_indices(".register(") {
            let rest = text[i + ".register(".len()..].trim_start();
            if let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) {
                names.insert(format!("plexus_{name}"));
            }
        }
    }
    names
}

/// Whether series `name` is one of a registered metric's: the gauge itself, a counter's
/// `_total`, a histogram's `_bucket`, `_sum`, `_count`.
fn is_registered(known: &BTreeSet<String>, name: &str) -> bool {
    known.contains(name)
        || ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.strip_suffix(s).is_some_and(|b| known.contains(b)))
}

/// The metric names an expression reads: identifiers followed by `{`, `[`, `)` or an
/// operator, that are not PromQL functions, keywords, label names or strings.
fn expr_names(expr: &str) -> BTreeSet<String> {
    const WORDS: [&str; 27] = [
        "sum",
        "rate",
        "increase",
        "by",
        "without",
        "and",
        "or",
        "unless",
        "on",
        "ignoring",
        "histogram_quantile",
        "max",
        "min",
        "count",
        "avg",
        "label_values",
        "topk",
        "irate",
        "le",
        "node",
        "pf",
        "state",
        "verb",
        "resource",
        "type",
        "phase",
        "class",
    ];
    let mut names = BTreeSet::new();
    // Drop string literals and `{...}` matchers, so that label names and values are not read.
    let mut clean = String::new();
    let (mut in_str, mut depth) = (false, 0);
    for c in expr.chars() {
        if in_str {
            in_str = c != '"';
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' => {
                depth += 1;
                clean.push(' ');
            }
            '}' => {
                depth -= 1;
                clean.push(' ');
            }
            _ if depth > 0 => {}
            _ => clean.push(c),
        }
    }
    // `by (a, b)` / `without (...)` lists: label names.
    let mut text = String::new();
    let mut rest = clean.as_str();
    while let Some(i) = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_') {
        text.push_str(&rest[..i]);
        rest = &rest[i..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        rest = &rest[end..];
        if matches!(word, "by" | "without" | "on" | "ignoring") {
            if let Some(close) = rest.find(')') {
                rest = &rest[close + 1..];
            }
            continue;
        }
        text.push_str(word);
        text.push(' ');
    }
    for w in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
        if w.is_empty() || w.chars().next().is_some_and(|c| c.is_ascii_digit()) {
            continue;
        }
        if WORDS.contains(&w) || w.starts_with("__") || w.contains("rate_interval") {
            continue;
        }
        names.insert(w.to_string());
    }
    names
}

/// The `expr:` texts of the plain rule file (block scalars `|` and one-liners).
fn rule_exprs() -> Vec<String> {
    let text =
        std::fs::read_to_string(monitoring_dir().join("rules/plexus.rules.yaml")).expect("rules");
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        let t = l.trim_start();
        let Some(v) = t.strip_prefix("expr:") else {
            continue;
        };
        let v = v.trim();
        if v == "|" {
            let indent = l.len() - t.len();
            let mut e = String::new();
            while let Some(n) = lines.peek() {
                if n.len() - n.trim_start().len() <= indent && !n.trim().is_empty() {
                    break;
                }
                e.push_str(n);
                e.push('\n');
                lines.next();
            }
            out.push(e);
        } else {
            out.push(v.to_string());
        }
    }
    out
}

/// Every `expr` and `query` string of the dashboard (panels, targets, template variables).
fn dashboard_exprs() -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", serde_json::Value::String(s))
                            if s != "prometheus" =>
                        {
                            out.push(s.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let text = std::fs::read_to_string(monitoring_dir().join("grafana-dashboard.json"))
        .expect("grafana-dashboard.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    walk(&v, &mut out);
    out
}

#[test]
fn expression_names_are_found() {
    // The name reader itself: names, not functions, labels or values.
    let names = expr_names(
        r#"histogram_quantile(0.99, sum by (node, le) (rate(plexus_x_bucket{verb="ADD",a=~"b|c"}[10m]))) > 5 and up{job="p"} == 0"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["plexus_x_bucket".to_string(), "up".to_string()])
    );
}

#[test]
fn every_metric_name_in_the_rules_and_the_dashboard_is_registered() {
    let known = registered();
    assert!(
        known.contains("plexus_cni_requests") && known.contains("plexus_queue_depth"),
        "the registry reads oddly: {known:?}"
    );
    let rules = rule_exprs();
    assert_eq!(rules.len(), 7, "{rules:?}");
    let dashboard = dashboard_exprs();
    assert!(dashboard.len() >= 15, "{dashboard:?}");
    let mut used = BTreeSet::new();
    for (what, exprs) in [("rules", &rules), ("dashboard", &dashboard)] {
        for e in exprs.iter() {
            let names = expr_names(e);
            assert!(!names.is_empty(), "{what}: no metric in {e}");
            for n in names {
                assert!(
                    is_registered(&known, &n) || EXTERNAL.contains(&n.as_str()),
                    "{what}: {n} (in {e}) is neither registered by plexus nor one of {EXTERNAL:?}"
                );
                used.insert(n);
            }
        }
    }
    // The alerts the issue names are all there.
    let text =
        std::fs::read_to_string(monitoring_dir().join("rules/plexus.rules.yaml")).expect("rules");
    for n in [
        "plexus_cni_requests_total",
        "plexus_cni_request_duration_seconds_bucket",
        "plexus_status_writes_given_up_total",
        "plexus_sriov_vfs",
        "plexus_address_claim_conflicts_total",
        "kube_pod_status_ready",
        "up",
    ] {
        assert!(used.contains(n), "no expression reads {n}");
        assert!(text.contains(n), "the rules do not read {n}");
    }
}
