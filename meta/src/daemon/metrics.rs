//! The daemon's Prometheus metrics (the `prometheus-client` crate, OpenMetrics text) and its
//! HTTP endpoint: `/metrics`, `/healthz` (the process answers), `/readyz` (caches synced and
//! not draining).

use super::cache::{Caches, Kind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerbResult {
    verb: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Verb {
    verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Resource {
    resource: String,
}

fn latency_histogram() -> Histogram {
    // 0.25 ms … ~8 s.
    Histogram::new(exponential_buckets(0.00025, 2.0, 16))
}

/// Every metric the daemon exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<VerbResult, Counter>,
    latency: Family<Verb, Histogram, fn() -> Histogram>,
    queue_depth: Gauge,
    in_flight: Gauge,
    synced: Family<Resource, Gauge>,
    objects: Family<Resource, Gauge>,
    restarts: Family<Resource, Counter>,
    misses: Family<Resource, Counter>,
    /// Set once SIGTERM was received.
    pub draining: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("plexus");
        let requests = Family::<VerbResult, Counter>::default();
        registry.register(
            "cni_requests",
            "CNI requests served, by verb and result (ok, error, busy)",
            requests.clone(),
        );
        let latency: Family<Verb, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "cni_request_duration_seconds",
            "Time to serve a CNI request (queue wait included), by verb",
            latency.clone(),
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
            queue_depth,
            in_flight,
            synced,
            objects,
            restarts,
            misses,
            draining: AtomicBool::new(false),
        }
    }

    /// A request finished.
    pub fn request(&self, verb: &str, result: &str, took: Duration) {
        self.requests
            .get_or_create(&VerbResult {
                verb: verb.into(),
                result: result.into(),
            })
            .inc();
        self.latency
            .get_or_create(&Verb { verb: verb.into() })
            .observe(took.as_secs_f64());
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
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` on `listener` (HTTP/1.0-style: one request per
/// connection).
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, caches: Arc<Caches>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let (metrics, caches) = (Arc::clone(&metrics), Arc::clone(&caches));
        tokio::spawn(async move {
            let mut buf = vec![0u8; 2048];
            let mut n = 0;
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while n < buf.len() {
                    match conn.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let ready = caches.synced() && !metrics.draining.load(Ordering::SeqCst);
            let (code, ctype, body) = match path {
                "/metrics" => (
                    "200 OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    metrics.encode(),
                ),
                "/healthz" => ("200 OK", "text/plain", "ok\n".to_string()),
                "/readyz" if ready => ("200 OK", "text/plain", "ready\n".to_string()),
                "/readyz" => (
                    "503 Service Unavailable",
                    "text/plain",
                    if metrics.draining.load(Ordering::SeqCst) {
                        "draining\n".to_string()
                    } else {
                        "caches not synced\n".to_string()
                    },
                ),
                _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
            };
            let resp = format!(
                "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(resp.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}
