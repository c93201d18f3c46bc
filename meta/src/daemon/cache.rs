//! The daemon's watch caches: the pods of this node (`spec.nodeName` field selector) and every
//! NetworkAttachmentDefinition, kept by two long-lived `kube::runtime::watcher` streams (LIST,
//! then WATCH from its resourceVersion with bookmarks; a 410 Gone or a dropped watch relists
//! and the new list replaces the cache atomically, like a reflector's store). Only the fields
//! plexus reads are kept: a pod's name, namespace, UID, annotations, node and DRA claim status;
//! a NAD's `spec.config` and resource-name annotation.
//!
//! [`CacheInputs`] is the daemon's side of the [`Inputs`] seam: no API request for a pod or a
//! NAD that is cached; a pod not (yet) cached — watch lag right after scheduling — is waited
//! for briefly, then read with one GET.

use super::metrics::Metrics;
use crate::context::Ctx;
use crate::devices::dra::DraDevice;
use crate::error::MetaError;
use crate::inputs::api::{fetch_nads, fetch_pod};
use crate::inputs::Inputs;
use crate::k8s::{KubeClient, Nad, Pod};
use crate::plan::requests::NadMap;
use crate::plan::resolve::NadData;
use crate::plan::DeviceMap;
use crate::pod::{PodIdentity, PodInfo};
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

type Key = (String, String);

#[derive(Default)]
struct State {
    pods: HashMap<Key, PodInfo>,
    nads: HashMap<Key, NadData>,
    pods_synced: bool,
    nads_synced: bool,
    /// Objects of a LIST in progress (replace the cache at `InitDone`).
    pods_init: Option<HashMap<Key, PodInfo>>,
    nads_init: Option<HashMap<Key, NadData>>,
}

/// The node's pods and the cluster's NADs, as plexus needs them.
#[derive(Default)]
pub struct Caches {
    state: Mutex<State>,
    changed: Condvar,
}

/// Which cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Pods of this node.
    Pods,
    /// NetworkAttachmentDefinitions.
    Nads,
}

impl Kind {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Pods => "pods",
            Kind::Nads => "network-attachment-definitions",
        }
    }
}

fn key_of(meta: &kube::api::ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// What plexus keeps of a pod object.
pub fn slim_pod(pod: &Pod) -> PodInfo {
    let (namespace, name) = key_of(&pod.metadata);
    PodInfo::from_pod(
        pod,
        &PodIdentity {
            namespace,
            name,
            ..Default::default()
        },
    )
}

impl Caches {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Static mode (no API): nothing to watch, ready at once.
    pub fn mark_static(&self) {
        let mut s = self.lock();
        s.pods_synced = true;
        s.nads_synced = true;
    }

    /// True once both caches have completed their first LIST.
    pub fn synced(&self) -> bool {
        let s = self.lock();
        s.pods_synced && s.nads_synced
    }

    /// Cached objects: (pods, NADs).
    pub fn len(&self) -> (usize, usize) {
        let s = self.lock();
        (s.pods.len(), s.nads.len())
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// The cached pod `id` names (its UID too when `id` has one).
    pub fn pod(&self, id: &PodIdentity) -> Option<PodInfo> {
        let s = self.lock();
        Self::matching(&s, id)
    }

    fn matching(s: &State, id: &PodIdentity) -> Option<PodInfo> {
        s.pods
            .get(&(id.namespace.clone(), id.name.clone()))
            .filter(|p| id.uid.is_empty() || p.id.uid == id.uid)
            .map(|p| PodInfo {
                id: PodIdentity {
                    uid: p.id.uid.clone(),
                    ..id.clone()
                },
                ..p.clone()
            })
    }

    /// Wait for the pod to appear in the cache: while the pod cache has not completed its
    /// first LIST, up to `sync_wait` for that LIST (it brings the node's pods: a restarted
    /// daemon answers its first calls from it instead of one GET each, which is what a fleet
    /// of daemons restarting at once cannot afford); once synced, up to `wait` more for the
    /// watch to deliver a pod created just now.
    pub fn wait_pod(
        &self,
        id: &PodIdentity,
        wait: Duration,
        sync_wait: Duration,
    ) -> Option<PodInfo> {
        let start = Instant::now();
        let sync_deadline = start + sync_wait;
        let mut deadline = start + wait;
        let mut s = self.lock();
        loop {
            if let Some(p) = Self::matching(&s, id) {
                return Some(p);
            }
            let now = Instant::now();
            let until = if s.pods_synced {
                deadline
            } else {
                sync_deadline
            };
            if now >= until {
                return None;
            }
            let was_synced = s.pods_synced;
            s = self
                .changed
                .wait_timeout(s, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            if !was_synced && s.pods_synced {
                // The first LIST may lag the pod's creation like the watch does.
                deadline = Instant::now() + wait;
            }
        }
    }

    /// Wait up to `wait` for the NAD cache's first LIST (true once it has completed).
    pub fn wait_nads_synced(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut s = self.lock();
        loop {
            if s.nads_synced {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The cached NADs of `ns`, by name.
    pub fn namespace_nads(&self, ns: &str) -> Vec<(String, NadData)> {
        self.lock()
            .nads
            .iter()
            .filter(|((n, _), _)| n == ns)
            .map(|((_, name), d)| (name.clone(), d.clone()))
            .collect()
    }

    /// The cached NAD `ns/name`.
    pub fn nad(&self, ns: &str, name: &str) -> Option<NadData> {
        self.lock()
            .nads
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Whether the pod cache has completed a LIST.
    pub fn pods_synced(&self) -> bool {
        self.lock().pods_synced
    }

    /// Whether the NAD cache has completed a LIST (a miss then means "not found" unless the
    /// watch lags).
    pub fn nads_synced(&self) -> bool {
        self.lock().nads_synced
    }

    fn apply_pod(&self, ev: Event<Pod>) {
        let mut s = self.lock();
        match ev {
            Event::Init => s.pods_init = Some(HashMap::new()),
            Event::InitApply(p) => {
                let k = key_of(&p.metadata);
                s.pods_init
                    .get_or_insert_with(HashMap::new)
                    .insert(k, slim_pod(&p));
            }
            Event::InitDone => {
                s.pods = s.pods_init.take().unwrap_or_default();
                s.pods_synced = true;
            }
            Event::Apply(p) => {
                s.pods.insert(key_of(&p.metadata), slim_pod(&p));
            }
            Event::Delete(p) => {
                let k = key_of(&p.metadata);
                // A delete of an older incarnation must not drop a newer pod of the same name.
                if s.pods
                    .get(&k)
                    .is_some_and(|c| Some(&c.id.uid) == p.metadata.uid.as_ref())
                {
                    s.pods.remove(&k);
                }
            }
        }
        drop(s);
        self.changed.notify_all();
    }

    fn apply_nad(&self, ev: Event<Nad>) {
        let mut s = self.lock();
        match ev {
            Event::Init => s.nads_init = Some(HashMap::new()),
            Event::InitApply(n) => {
                let k = key_of(&n.metadata);
                s.nads_init
                    .get_or_insert_with(HashMap::new)
                    .insert(k, NadData::from_nad(&n));
            }
            Event::InitDone => {
                s.nads = s.nads_init.take().unwrap_or_default();
                s.nads_synced = true;
            }
            Event::Apply(n) => {
                s.nads.insert(key_of(&n.metadata), NadData::from_nad(&n));
            }
            Event::Delete(n) => {
                s.nads.remove(&key_of(&n.metadata));
            }
        }
        drop(s);
        self.changed.notify_all();
    }
}

/// First delay before a failed watch is retried.
const WATCH_BACKOFF_FIRST: Duration = Duration::from_millis(500);
/// Longest delay between retries of a failed watch.
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Retry delays of a failed watch: 0.5 s doubling up to 5 s, each ±25 % (jitter, so the nodes
/// of a cluster do not reconnect in step after an apiserver restart), back to 0.5 s at the
/// first event after a failure. kube's default (0.8 s to 30 s, as client-go's reflector) left
/// the cache up to ~25 s behind an apiserver that had been down for 2 s; during that time every
/// new pod costs its ADD the pod wait and a GET.
#[derive(Debug)]
pub struct WatchBackoff {
    next: Duration,
    seed: u64,
}

impl WatchBackoff {
    /// A backoff; `salt` decorrelates the watches of one process.
    pub fn new(salt: u64) -> WatchBackoff {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
        WatchBackoff {
            next: WATCH_BACKOFF_FIRST,
            seed: (nanos ^ (u64::from(std::process::id()) << 20) ^ salt) | 1,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // xorshift64: enough for jitter.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let factor = 0.75 + (self.seed % 1000) as f64 / 2000.0;
        let d = self.next.mul_f64(factor);
        self.next = (self.next * 2).min(WATCH_BACKOFF_MAX);
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_BACKOFF_FIRST;
    }
}

/// The watchers' LIST: served from the API server's watch cache (`resourceVersion=0`,
/// `NotOlderThan`, no `limit`) like client-go's informers, never from etcd. kube's default
/// page size makes it drop `resourceVersion=0` (a paged LIST cannot use it), which turns every
/// daemon's initial LIST and relist into a consistent read that etcd answers by scanning every
/// pod of the cluster for the node's few (measured: `plexus-bench --fleet`, docs/performance.md).
/// `node` selects the node's pods; empty for every object (the NADs).
fn list_config(node: &str) -> watcher::Config {
    let mut cfg = watcher::Config::default().any_semantic();
    cfg.page_size = None;
    if !node.is_empty() {
        cfg = cfg.fields(&format!("spec.nodeName={node}"));
    }
    cfg
}

/// Run both watches until the runtime stops: pods of `node` (all pods when empty) and NADs.
/// Errors restart the watch with kube's default backoff and are counted.
pub async fn run_watches(
    caches: Arc<Caches>,
    client: KubeClient,
    node: String,
    metrics: Arc<Metrics>,
) {
    let Some(kc) = client.kube_client() else {
        tracing::error!(
            "the daemon's client has no kube::Client: no watches, every call reads the API"
        );
        return;
    };
    let pods: Api<Pod> = Api::all(kc.clone());
    let pod_cfg = list_config(&node);
    let nads: Api<Nad> = Api::all(kc);
    let nad_cfg = list_config("");
    let (c1, m1) = (Arc::clone(&caches), Arc::clone(&metrics));
    let pod_loop = async move {
        let mut s = watcher::watcher(pods, pod_cfg)
            .backoff(WatchBackoff::new(1))
            .boxed();
        while let Some(ev) = s.next().await {
            match ev {
                Ok(ev) => {
                    c1.apply_pod(ev);
                    m1.cache_changed(Kind::Pods, &c1);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pod watch failed; restarting");
                    m1.watch_restart(Kind::Pods);
                }
            }
        }
    };
    let (c2, m2) = (caches, metrics);
    let nad_loop = async move {
        let mut s = watcher::watcher(nads, nad_cfg)
            .backoff(WatchBackoff::new(2))
            .boxed();
        while let Some(ev) = s.next().await {
            match ev {
                Ok(ev) => {
                    c2.apply_nad(ev);
                    m2.cache_changed(Kind::Nads, &c2);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "NAD watch failed; restarting");
                    m2.watch_restart(Kind::Nads);
                }
            }
        }
    };
    futures::join!(pod_loop, nad_loop);
}

/// The daemon's inputs: the caches, with one GET per miss.
pub struct CacheInputs {
    /// The caches.
    pub caches: Arc<Caches>,
    /// The daemon's client (`None`: static mode).
    pub client: Option<KubeClient>,
    /// How long a pod missing from the synced cache is waited for before the GET.
    pub pod_wait: Duration,
    /// How long a call waits for the pod cache's first LIST before the GET.
    pub sync_wait: Duration,
    /// Counters.
    pub metrics: Arc<Metrics>,
}

impl Inputs for CacheInputs {
    fn pod(&mut self, ctx: &mut Ctx, id: &PodIdentity) -> Result<Option<PodInfo>, MetaError> {
        if self.client.is_none() {
            return Ok(None);
        }
        if let Some(p) = self.caches.wait_pod(id, self.pod_wait, self.sync_wait) {
            return Ok(Some(p));
        }
        self.metrics.cache_miss(Kind::Pods);
        // The runtime's copy of the pod's annotations, when it passes them (the installer
        // declares the capability): what thin mode uses instead of the GET.
        if let Some(p) = crate::inputs::api::pod_from_runtime(&ctx.config, Some(id)) {
            tracing::info!(pod = %id.key(), "pod not in the watch cache: using the runtime's pod annotations");
            return Ok(Some(p));
        }
        tracing::info!(pod = %id.key(), "pod not in the watch cache: reading it");
        fetch_pod(ctx, self.client.as_ref(), Some(id))
    }

    fn nads(
        &mut self,
        ctx: &mut Ctx,
        refs: &[(String, String)],
        label: &str,
    ) -> Result<NadMap, MetaError> {
        let mut map = NadMap::new();
        if self.client.is_none() {
            return Ok(map);
        }
        // A starting daemon's first calls: from its first LIST, not a GET each (see
        // `Caches::wait_pod`).
        self.caches.wait_nads_synced(self.sync_wait);
        let mut missing = Vec::new();
        for r in refs {
            match self.caches.nad(&r.0, &r.1) {
                Some(n) => {
                    map.insert(r.clone(), Some(n));
                }
                None => missing.push(r.clone()),
            }
        }
        if !missing.is_empty() {
            // Not cached: just created (watch lag) or really missing; the API decides.
            self.metrics.cache_miss(Kind::Nads);
            map.extend(fetch_nads(ctx, self.client.as_ref(), &missing, label)?);
        }
        Ok(map)
    }

    fn devices(
        &mut self,
        ctx: &mut Ctx,
        pod: &PodInfo,
        wanted: &BTreeSet<String>,
    ) -> Result<(DeviceMap, Vec<DraDevice>), MetaError> {
        crate::inputs::devices::allocated(ctx, self.client.as_ref(), pod, wanted)
    }

    fn client(&mut self, _ctx: &mut Ctx) -> Result<Option<KubeClient>, MetaError> {
        Ok(self.client.clone())
    }

    fn namespace_nads(&mut self, _ctx: &mut Ctx, ns: &str) -> Option<Vec<(String, NadData)>> {
        self.client.as_ref()?;
        self.caches.wait_nads_synced(self.sync_wait);
        Some(self.caches.namespace_nads(ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, uid: &str) -> Pod {
        serde_json::from_value(json!({"metadata":{"name":name,"namespace":"db","uid":uid,
            "annotations":{"k8s.v1.cni.cncf.io/networks":"mv"},"managedFields":[{"manager":"x"}]},
            "spec":{"nodeName":"n1","containers":[{"name":"c","image":"busybox"}]},
            "status":{"phase":"Pending"}}))
        .unwrap()
    }

    fn id(name: &str, uid: &str) -> PodIdentity {
        PodIdentity {
            namespace: "db".into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_cache_miss_the_api_refuses_fails_with_the_typed_read_error() {
        use crate::k8s::testutil::{json_response, MockApi};
        use crate::k8s::K8sError;
        use plexus_conf::plexus_config::PlexusConfig;

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mock = MockApi::repeating(json_response(
            403,
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"m","reason":"Forbidden","code":403}"#,
        ));
        let client = {
            let _in_rt = rt.enter();
            mock.client()
        };
        let cfg = PlexusConfig::parse(
            br#"{"cniVersion":"1.0.0","name":"p","type":"plexus","delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}]}"#,
        )
        .unwrap();
        let mut ctx =
            Ctx::from_config(cfg, &[], None).with_shared(rt.handle().clone(), Some(client.clone()));
        let caches = Arc::new(Caches::default());
        caches.apply_nad(Event::Init);
        caches.apply_nad(Event::InitApply(
            serde_json::from_value(json!({"metadata":{"name":"cached","namespace":"db"},
                "spec":{"config":"{\"cniVersion\":\"1.0.0\",\"type\":\"macvlan\"}"}}))
            .unwrap(),
        ));
        caches.apply_nad(Event::InitDone);
        let mut inputs = CacheInputs {
            caches,
            client: Some(client),
            pod_wait: Duration::ZERO,
            sync_wait: Duration::ZERO,
            metrics: Arc::new(Metrics::new()),
        };
        let forbidden = |s: &K8sError| matches!(s, K8sError::Api { code: 403, .. });

        // The pod cache has not synced: straight to the GET, which is refused.
        let e = inputs.pod(&mut ctx, &id("a", "u1")).unwrap_err();
        assert!(
            matches!(&e, MetaError::PodRead { pod, source } if pod == "db/a" && forbidden(source)),
            "{e:?}"
        );
        assert_eq!(e.code(), 102);

        // A cached NAD costs nothing; the missing one is read, and that read is refused.
        let refs = vec![
            ("db".to_string(), "cached".to_string()),
            ("db".to_string(), "new".to_string()),
        ];
        let map = inputs.nads(&mut ctx, &refs[..1], "pod db/a").unwrap();
        assert!(map[&refs[0]].is_some());
        assert_eq!(mock.requests().len(), 1, "only the pod GET so far");
        let e = inputs.nads(&mut ctx, &refs, "pod db/a").unwrap_err();
        assert!(
            matches!(&e, MetaError::NadRead { pod, ns, name, source }
                if pod == "pod db/a" && ns == "db" && name == "new" && forbidden(source)),
            "{e:?}"
        );
        assert_eq!(
            e.msg(),
            "pod db/a, network db/new: cannot read the NetworkAttachmentDefinition"
        );
    }

    #[test]
    fn watch_retries_back_off_to_5_s_with_jitter_and_reset() {
        use kube::runtime::utils::Backoff as _;
        let mut b = WatchBackoff::new(7);
        let d: Vec<Duration> = b.by_ref().take(8).collect();
        assert!(d[0] >= Duration::from_millis(375) && d[0] <= Duration::from_millis(625));
        assert!(d[1] > d[0] / 2 && d[1] <= Duration::from_millis(1250));
        assert!(d.iter().all(|x| *x <= Duration::from_millis(6250)));
        assert!(d[7] >= Duration::from_millis(3750), "{d:?}");
        b.reset();
        assert!(b.next().unwrap() <= Duration::from_millis(625));
    }

    #[test]
    fn a_relist_replaces_the_cache_and_deletes_respect_the_uid() {
        let c = Caches::default();
        c.apply_pod(Event::Init);
        c.apply_pod(Event::InitApply(pod("a", "u1")));
        assert!(c.pod(&id("a", "")).is_none(), "not visible before InitDone");
        c.apply_pod(Event::InitDone);
        let got = c.pod(&id("a", "")).unwrap();
        assert_eq!(got.id.uid, "u1");
        assert_eq!(got.annotations["k8s.v1.cni.cncf.io/networks"], "mv");
        assert_eq!(got.claims.unwrap().node_name, "n1");
        // Another UID is not this pod.
        assert!(c.pod(&id("a", "u2")).is_none());
        // A recreated pod replaces it; the old incarnation's delete leaves the new one.
        c.apply_pod(Event::Apply(pod("a", "u2")));
        c.apply_pod(Event::Delete(pod("a", "u1")));
        assert_eq!(c.pod(&id("a", "")).unwrap().id.uid, "u2");
        // A relist (410 Gone) without the pod drops it.
        c.apply_pod(Event::Init);
        c.apply_pod(Event::InitApply(pod("b", "u3")));
        c.apply_pod(Event::InitDone);
        assert!(c.pod(&id("a", "")).is_none());
        assert!(c.pod(&id("b", "u3")).is_some());
    }

    #[test]
    fn waiting_for_a_pod_ends_when_the_watch_delivers_it() {
        let c = Arc::new(Caches::default());
        // Unsynced: the first LIST is waited for, `sync_wait` at most.
        let t = Instant::now();
        assert!(c
            .wait_pod(&id("late", ""), Duration::from_secs(5), Duration::ZERO)
            .is_none());
        assert!(t.elapsed() < Duration::from_secs(1));
        let t = Instant::now();
        assert!(c
            .wait_pod(
                &id("late", ""),
                Duration::from_secs(5),
                Duration::from_millis(50)
            )
            .is_none());
        assert!(t.elapsed() >= Duration::from_millis(50) && t.elapsed() < Duration::from_secs(1));
        // The NAD cache's first LIST likewise.
        assert!(!c.wait_nads_synced(Duration::from_millis(20)));
        let c3 = Arc::clone(&c);
        let nad_lister = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            c3.apply_nad(Event::Init);
            c3.apply_nad(Event::InitDone);
        });
        assert!(c.wait_nads_synced(Duration::from_secs(5)));
        nad_lister.join().unwrap();
        // The first LIST brings the pod: the waiting call gets it, no GET.
        let c2 = Arc::clone(&c);
        let lister = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            c2.apply_pod(Event::Init);
            c2.apply_pod(Event::InitApply(pod("listed", "u8")));
            c2.apply_pod(Event::InitDone);
        });
        let got = c.wait_pod(&id("listed", "u8"), Duration::ZERO, Duration::from_secs(5));
        lister.join().unwrap();
        assert_eq!(got.unwrap().id.uid, "u8");
        let c2 = Arc::clone(&c);
        let feeder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            c2.apply_pod(Event::Apply(pod("late", "u9")));
        });
        let got = c.wait_pod(&id("late", "u9"), Duration::from_secs(5), Duration::ZERO);
        feeder.join().unwrap();
        assert_eq!(got.unwrap().id.uid, "u9");
        // Synced and absent: the wait is bounded.
        let t = Instant::now();
        assert!(c
            .wait_pod(&id("never", ""), Duration::from_millis(50), Duration::ZERO)
            .is_none());
        assert!(t.elapsed() >= Duration::from_millis(50));
    }
}
