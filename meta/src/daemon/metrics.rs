//! The metric families both modes export (docs/metrics.md), in one `prometheus-client`
//! registry (OpenMetrics text): the daemon's, fed as its calls run, or thin mode's exporter's,
//! fed from the calls' outcome lines ([`tail`]). [`super::metrics_http`] serves it.

pub mod tail;
pub mod vf_pool;

use super::cache::{Caches, Kind};
use crate::outcome::{Outcome, Sink};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Request {
    verb: String,
    result: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Verb {
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Phase {
    verb: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Delegate {
    verb: String,
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Api {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Resource {
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Class {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Vfs {
    pf: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Build {
    version: String,
    commit: String,
    mode: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.25 ms … ~8 s.
    Histogram::new(exponential_buckets(0.00025, 2.0, 16))
}

/// The CNI verbs as labels; anything else (a request that could not be read) is `other`.
fn verb_label(v: &str) -> &str {
    match v {
        "ADD" | "DEL" | "CHECK" | "STATUS" | "GC" | "VERSION" => v,
        _ => "other",
    }
}

/// A label value read from a thin call's line: short, of the characters plexus' own values
/// use; anything else is `other` (the file is root's, but a label set must stay bounded).
fn bounded(v: &str) -> &str {
    let ok = !v.is_empty()
        && v.len() <= 48
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        v
    } else {
        "other"
    }
}

/// Every metric one mode exports (docs/metrics.md): the daemon's registry, or thin mode's
/// exporter's (the same families; the daemon-only ones stay empty there).
pub struct Metrics {
    registry: Registry,
    requests: Family<Request, Counter>,
    latency: Histograms<Verb>,
    phases: Histograms<Phase>,
    delegates: Histograms<Delegate>,
    delegate_errors: Family<Delegate, Counter>,
    api: Family<Api, Counter>,
    status_pending: Gauge,
    status_given_up: Counter,
    claim_conflicts: Counter,
    claim_takeovers: Counter,
    refusals: Family<Class, Counter>,
    vfs: Family<Vfs, Gauge>,
    queue_depth: Gauge,
    in_flight: Gauge,
    synced: Family<Resource, Gauge>,
    objects: Family<Resource, Gauge>,
    restarts: Family<Resource, Counter>,
    misses: Family<Resource, Counter>,
    /// Read at each render for `plexus_status_writes_pending`.
    pending_source: Mutex<Option<fn() -> usize>>,
    /// Set once SIGTERM was received.
    pub draining: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn histograms<L: Clone + std::hash::Hash + Eq>() -> Histograms<L> {
    Family::new_with_constructor(latency_histogram)
}

impl Metrics {
    /// Daemon mode's registry, every metric registered.
    pub fn new() -> Metrics {
        Self::for_mode("daemon")
    }

    /// A registry with every metric registered; `mode` (`daemon`, `thin`) for
    /// `plexus_build_info`.
    pub fn for_mode(mode: &str) -> Metrics {
        let mut registry = Registry::with_prefix("plexus");
        let build = Family::<Build, Gauge>::default();
        build
            .get_or_create(&Build {
                version: crate::build_info::version().into(),
                commit: crate::build_info::commit().into(),
                mode: mode.into(),
            })
            .set(1);
        registry.register("build_info", "Build facts (always 1)", build);
        let requests = Family::<Request, Counter>::default();
        registry.register(
            "cni_requests",
            "CNI requests served, by verb, result (ok, error, busy) and CNI code (0 when ok)",
            requests.clone(),
        );
        let latency = histograms();
        registry.register(
            "cni_request_duration_seconds",
            "Time to serve a CNI request (daemon: queue wait included), by verb",
            latency.clone(),
        );
        let phases = histograms();
        registry.register(
            "cni_phase_duration_seconds",
            "Time of each phase of a CNI request (the closing log line's phases=), by verb and phase",
            phases.clone(),
        );
        let delegates = histograms();
        registry.register(
            "delegate_duration_seconds",
            "Time of each delegate plugin exec, by CNI verb and plugin type",
            delegates.clone(),
        );
        let delegate_errors = Family::<Delegate, Counter>::default();
        registry.register(
            "delegate_errors",
            "Delegate plugin execs that failed, by CNI verb and plugin type",
            delegate_errors.clone(),
        );
        let api = Family::<Api, Counter>::default();
        registry.register(
            "api_requests",
            "API server requests, by verb, resource and HTTP code (error: no answer)",
            api.clone(),
        );
        let status_pending = Gauge::default();
        registry.register(
            "status_writes_pending",
            "network-status writes waiting to be sent or retried",
            status_pending.clone(),
        );
        let status_given_up = Counter::default();
        registry.register(
            "status_writes_given_up",
            "network-status writes abandoned after their retries",
            status_given_up.clone(),
        );
        let claim_conflicts = Counter::default();
        registry.register(
            "address_claim_conflicts",
            "ADDs refused because another live pod holds an address they want",
            claim_conflicts.clone(),
        );
        let claim_takeovers = Counter::default();
        registry.register(
            "address_claim_takeovers",
            "Stale address claims (their pod gone) taken over",
            claim_takeovers.clone(),
        );
        let refusals = Family::<Class, Counter>::default();
        registry.register(
            "nad_policy_refusals",
            "NADs refused by the node's NAD policy, by class",
            refusals.clone(),
        );
        let vfs = Family::<Vfs, Gauge>::default();
        registry.register(
            "sriov_vfs",
            "SR-IOV VFs per PF netdev, by state (free, attached)",
            vfs.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "CNI requests accepted and waiting for a worker",
            queue_depth.clone(),
        );
        let in_flight = Gauge::default();
        registry.register("in_flight", "CNI requests being served", in_flight.clone());
        let synced = Family::<Resource, Gauge>::default();
        registry.register(
            "cache_synced",
            "1 once the watch cache completed its first list",
            synced.clone(),
        );
        let objects = Family::<Resource, Gauge>::default();
        registry.register(
            "cache_objects",
            "Objects in the watch cache",
            objects.clone(),
        );
        let restarts = Family::<Resource, Counter>::default();
        registry.register(
            "watch_restarts",
            "Watch streams that failed and were restarted",
            restarts.clone(),
        );
        let misses = Family::<Resource, Counter>::default();
        registry.register(
            "cache_misses",
            "Objects read from the API because the cache did not have them",
            misses.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            phases,
            delegates,
            delegate_errors,
            api,
            status_pending,
            status_given_up,
            claim_conflicts,
            claim_takeovers,
            refusals,
            vfs,
            queue_depth,
            in_flight,
            synced,
            objects,
            restarts,
            misses,
            pending_source: Mutex::new(None),
            draining: AtomicBool::new(false),
        }
    }

    /// Count a finished call: its request, duration and phases, and whatever events it
    /// carries (a thin call's line; the daemon reports those through [`Sink`] as they happen).
    pub fn apply(&self, o: &Outcome) {
        if !o.verb.is_empty() {
            let verb = verb_label(&o.verb).to_string();
            let result = match o.result.as_str() {
                r @ ("ok" | "error" | "busy") => r,
                _ => "other",
            };
            self.requests
                .get_or_create(&Request {
                    verb: verb.clone(),
                    result: result.into(),
                    code: o.code.to_string(),
                })
                .inc();
            self.latency
                .get_or_create(&Verb { verb: verb.clone() })
                .observe(o.seconds);
            for (phase, secs) in &o.phases {
                self.phases
                    .get_or_create(&Phase {
                        verb: verb.clone(),
                        phase: bounded(phase).into(),
                    })
                    .observe(*secs);
            }
        }
        for (verb, ty, secs, ok) in &o.delegates {
            self.delegate(verb, ty, Duration::from_secs_f64(secs.max(0.0)), *ok);
        }
        for (verb, resource, code, n) in &o.api {
            self.api_count(verb, resource, code, u64::from(*n));
        }
        self.claim_conflicts.inc_by(u64::from(o.claim_conflicts));
        self.claim_takeovers.inc_by(u64::from(o.claim_takeovers));
        for (class, n) in &o.refusals {
            self.refusals
                .get_or_create(&Class {
                    class: bounded(class).into(),
                })
                .inc_by(u64::from(*n));
        }
        self.status_given_up.inc_by(u64::from(o.status_given_up));
    }

    fn api_count(&self, verb: &str, resource: &str, code: &str, n: u64) {
        let verb = match verb {
            "get" | "list" | "watch" | "patch" | "create" | "update" | "delete" => verb,
            _ => "other",
        };
        let code =
            if code == "error" || (code.len() == 3 && code.bytes().all(|b| b.is_ascii_digit())) {
                code
            } else {
                "other"
            };
        self.api
            .get_or_create(&Api {
                verb: verb.into(),
                resource: bounded(resource).into(),
                code: code.into(),
            })
            .inc_by(n);
    }

    /// A request finished (the daemon's server; a busy answer, say).
    pub fn request(&self, verb: &str, result: &str, code: u32, took: Duration) {
        self.apply(&Outcome {
            verb: verb.into(),
            result: result.into(),
            code,
            seconds: took.as_secs_f64(),
            ..Default::default()
        });
    }

    /// Read `plexus_status_writes_pending` from `f` at each render.
    pub fn pending_from(&self, f: fn() -> usize) {
        *self
            .pending_source
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// Set the VF pool of one PF.
    pub fn set_vfs(&self, pf: &str, free: u64, attached: u64) {
        for (state, n) in [("free", free), ("attached", attached)] {
            self.vfs
                .get_or_create(&Vfs {
                    pf: pf.into(),
                    state: state.into(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Forget every PF's VF pool (before setting the current ones).
    pub fn clear_vfs(&self) {
        self.vfs.clear();
    }

    /// The queue gauge.
    pub fn queue(&self) -> &Gauge {
        &self.queue_depth
    }

    /// The in-flight gauge.
    pub fn in_flight(&self) -> &Gauge {
        &self.in_flight
    }

    /// A cache changed: refresh its sync state and size.
    pub fn cache_changed(&self, kind: Kind, caches: &Caches) {
        let r = Resource {
            resource: kind.as_str().into(),
        };
        let (pods, nads) = caches.len();
        let n = if kind == Kind::Pods { pods } else { nads };
        self.objects.get_or_create(&r).set(n as i64);
        let synced = match kind {
            Kind::Pods => caches.pods_synced(),
            Kind::Nads => caches.nads_synced(),
        };
        self.synced.get_or_create(&r).set(i64::from(synced));
    }

    /// A watch failed and restarts.
    pub fn watch_restart(&self, kind: Kind) {
        self.restarts
            .get_or_create(&Resource {
                resource: kind.as_str().into(),
            })
            .inc();
    }

    /// An object was read from the API because the cache lacked it.
    pub fn cache_miss(&self, kind: Kind) {
        self.misses
            .get_or_create(&Resource {
                resource: kind.as_str().into(),
            })
            .inc();
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let pending = *self
            .pending_source
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(f) = pending {
            self.status_pending
                .set(i64::try_from(f()).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The daemon counts the events of every thread at once.
impl Sink for Metrics {
    fn api_request(&self, verb: &str, resource: &str, code: &str) {
        self.api_count(verb, resource, code, 1);
    }
    fn delegate(&self, verb: &str, plugin_type: &str, took: Duration, ok: bool) {
        let l = Delegate {
            verb: verb_label(verb).into(),
            r#type: bounded(plugin_type).into(),
        };
        self.delegates.get_or_create(&l).observe(took.as_secs_f64());
        if !ok {
            self.delegate_errors.get_or_create(&l).inc();
        }
    }
    fn claim_conflict(&self) {
        self.claim_conflicts.inc();
    }
    fn claim_takeover(&self) {
        self.claim_takeovers.inc();
    }
    fn policy_refusal(&self, class: &str) {
        self.refusals
            .get_or_create(&Class {
                class: bounded(class).into(),
            })
            .inc();
    }
    fn status_given_up(&self) {
        self.status_given_up.inc();
    }
}

/// Daemon mode: make `m` the sink of every event ([`crate::outcome::install`]), read the
/// status-write backlog from the background writer, and refresh the VF pool periodically.
pub fn install_daemon(m: &Arc<Metrics>) {
    crate::outcome::install(Arc::clone(m) as Arc<dyn Sink>);
    m.pending_from(crate::report::background::pending_count);
    vf_pool::spawn_refresh(Arc::clone(m), vf_pool::SYSFS, vf_pool::REFRESH);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo test --release -p plexus-meta --lib daemon::metrics::tests::cost -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement"]
    fn cost_of_counting_a_daemon_add() {
        let m = Metrics::new();
        let o = Outcome {
            verb: "ADD".into(),
            result: "ok".into(),
            seconds: 0.03,
            phases: [
                "queue",
                "request_read",
                "config",
                "pod_read",
                "plan",
                "delegates",
            ]
            .iter()
            .map(|n| (n.to_string(), 0.001))
            .collect(),
            ..Default::default()
        };
        let n = 20_000u32;
        let started = std::time::Instant::now();
        for _ in 0..n {
            // What a daemon ADD counts: its events as they happen, then the call.
            m.api_request("get", "network-attachment-definitions", "200");
            m.api_request("patch", "pods", "200");
            m.delegate("ADD", "bridge", Duration::from_millis(12), true);
            m.delegate("ADD", "macvlan", Duration::from_millis(12), true);
            m.apply(&o);
        }
        println!(
            "daemon ADD counted in {:.2} us (2 API requests, 2 delegates, 6 phases; {n} calls)",
            started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn events_and_calls_land_in_their_families() {
        let m = Metrics::new();
        m.api_request("patch", "pods", "200");
        m.api_request("patch", "pods", "200");
        m.api_request("get", "pods", "error");
        m.api_request("get", "secrets", "x-bad");
        m.delegate("ADD", "bridge", Duration::from_millis(3), true);
        m.delegate("ADD", "bridge", Duration::from_millis(3), false);
        m.delegate("DEL", "../../bin/sh", Duration::from_millis(1), false);
        m.claim_conflict();
        m.claim_takeover();
        m.claim_takeover();
        m.policy_refusal("path_logs");
        m.status_given_up();
        m.request("ADD", "busy", 11, Duration::from_millis(1));
        m.apply(&Outcome {
            verb: "ADD".into(),
            result: "error".into(),
            code: 7,
            seconds: 0.02,
            phases: vec![("config".into(), 0.001), ("delegates".into(), 0.015)],
            ..Default::default()
        });
        m.pending_from(|| 3);
        let t = m.encode();
        let v = |s: &str| value(&t, s).unwrap_or_else(|| panic!("{s} not in\n{t}"));
        assert_eq!(
            v(r#"plexus_api_requests_total{verb="patch",resource="pods",code="200"}"#),
            2.0
        );
        assert_eq!(
            v(r#"plexus_api_requests_total{verb="get",resource="pods",code="error"}"#),
            1.0
        );
        assert_eq!(
            v(r#"plexus_api_requests_total{verb="get",resource="secrets",code="other"}"#),
            1.0
        );
        assert_eq!(
            v(r#"plexus_delegate_duration_seconds_count{verb="ADD",type="bridge"}"#),
            2.0
        );
        assert_eq!(
            v(r#"plexus_delegate_errors_total{verb="ADD",type="bridge"}"#),
            1.0
        );
        assert_eq!(
            v(r#"plexus_delegate_errors_total{verb="DEL",type="other"}"#),
            1.0
        );
        assert_eq!(v("plexus_address_claim_conflicts_total"), 1.0);
        assert_eq!(v("plexus_address_claim_takeovers_total"), 2.0);
        assert_eq!(
            v(r#"plexus_nad_policy_refusals_total{class="path_logs"}"#),
            1.0
        );
        assert_eq!(v("plexus_status_writes_given_up_total"), 1.0);
        assert_eq!(v("plexus_status_writes_pending"), 3.0);
        assert_eq!(
            v(r#"plexus_cni_requests_total{verb="ADD",result="busy",code="11"}"#),
            1.0
        );
        assert_eq!(
            v(r#"plexus_cni_requests_total{verb="ADD",result="error",code="7"}"#),
            1.0
        );
        assert_eq!(
            v(r#"plexus_cni_request_duration_seconds_count{verb="ADD"}"#),
            2.0
        );
        assert_eq!(
            v(r#"plexus_cni_phase_duration_seconds_count{verb="ADD",phase="delegates"}"#),
            1.0
        );
        assert!(t.contains(r#"mode="daemon"} 1"#), "{t}");
        assert!(
            t.contains("# TYPE plexus_cni_request_duration_seconds histogram"),
            "{t}"
        );
    }
}
