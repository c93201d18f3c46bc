//! Daemon mode's network-status writes off the runtime's critical path: an ADD answers the
//! runtime as soon as its attachments are done, and the status PATCH runs in the background.
//!
//! Consistency (docs/daemon.md, "network-status in the background"):
//! - a reader sees the pod's network-status one PATCH later than the ADD's answer (the API
//!   server's few ms); the sandbox's containers start after the answer, so the window is
//!   normally closed before any of them runs;
//! - writes for one pod (`namespace/name`) are sent one at a time in ADD order, and a write
//!   superseded by a later ADD of the same pod, or whose container was DELeted, is dropped: an
//!   older sandbox's status never lands after a newer one's (a PATCH already on the wire
//!   finishes before the next one starts); each attempt is one request, checked first, so
//!   a DEL while the API server is down stops the retries;
//! - failures are retried (0.5 s doubling to 30 s, for [`STATUS_RETRY_FOR`]; a restarting
//!   apiserver answers 403 until its RBAC cache is loaded); a refusal (403, 422, …) cannot
//!   undo the attachments any more: the first one is logged and posted as a Warning event
//!   (`NetworkStatusFailed`), and the pod runs without network-status until a retry succeeds;
//! - SIGTERM waits (within the drain period) for the pending writes; a daemon killed before a
//!   write was sent loses it: that pod keeps running without network-status until its
//!   sandbox is recreated — unless its record under `cniDir` ([`journal`]) is replayed by the
//!   next daemon's first call. `--status-in-call` (`statusInCall`) restores the in-call PATCH
//!   (thin mode's semantics: a permanent refusal undoes the ADD, code 11/102).

use super::journal::{self, PendingStatus};
use super::STATUS_RETRY_FOR;
use crate::k8s::{EventType, K8sError, KubeClient, PodRef, RetryPolicy};
use crate::pod::PodIdentity;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

static BACKGROUND: AtomicBool = AtomicBool::new(false);
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// One pod's newest pending write.
struct Pending {
    generation: u64,
    container: String,
    /// Held while a write of this pod is checked and sent: one PATCH at a time per pod.
    lock: Arc<tokio::sync::Mutex<()>>,
}

fn pending() -> &'static Mutex<HashMap<String, Pending>> {
    static P: OnceLock<Mutex<HashMap<String, Pending>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

fn table() -> std::sync::MutexGuard<'static, HashMap<String, Pending>> {
    pending().lock().unwrap_or_else(|p| p.into_inner())
}

/// Turn background writes on (the daemon, unless `statusInCall`).
pub fn set_background(on: bool) {
    BACKGROUND.store(on, Ordering::SeqCst);
}

/// True when ADD leaves the status PATCH to the background.
pub fn background() -> bool {
    BACKGROUND.load(Ordering::SeqCst)
}

/// Writes registered and not yet finished or dropped.
pub fn pending_count() -> usize {
    table().len()
}

thread_local! {
    /// The container and `CNI_IFNAME` of the ADD this worker thread serves (set by the daemon
    /// around a call).
    static CONTAINER: std::cell::RefCell<(String, String)> =
        const { std::cell::RefCell::new((String::new(), String::new())) };
}

/// Run `f` as the call for `container` / `ifname` (the write it registers is cancelled by the
/// container's DEL, and recorded under its name, [`journal`]).
pub fn for_container<T>(container: &str, ifname: &str, f: impl FnOnce() -> T) -> T {
    CONTAINER.with(|c| *c.borrow_mut() = (container.to_string(), ifname.to_string()));
    let out = f();
    CONTAINER.with(|c| *c.borrow_mut() = Default::default());
    out
}

/// Register the network-status `status` of `pod` (for the current call's container),
/// superseding any pending write of the pod, and record it under `cni_dir` until it is over
/// ([`journal`]: a daemon killed before the PATCH replays it); the returned future writes it
/// (spawn it).
pub fn write_later(
    client: &KubeClient,
    pod: &PodIdentity,
    status: String,
    cni_dir: &Path,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (container_id, ifname) = CONTAINER.with(|c| c.borrow().clone());
    let rec = PendingStatus {
        container_id,
        ifname,
        pod: pod.clone(),
        status,
    };
    let file = journal::record(cni_dir, &rec);
    write_recorded(client, rec, file)
}

/// The write of a record a killed daemon left ([`journal::take_for_replay`]), registered now
/// (a DEL of its container or a newer ADD of its pod drops it); spawn the future.
pub fn replay(
    client: &KubeClient,
    rec: PendingStatus,
    file: PathBuf,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    tracing::info!(pod = %rec.pod.key(), container = %rec.container_id, "network-status left unwritten by an earlier daemon: writing it");
    write_recorded(client, rec, Some(file))
}

fn write_recorded(
    client: &KubeClient,
    rec: PendingStatus,
    file: Option<PathBuf>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let PendingStatus {
        container_id: container,
        pod,
        status,
        ..
    } = rec;
    let key = pod.key();
    let generation = GENERATION.fetch_add(1, Ordering::SeqCst);
    let lock = {
        let mut t = table();
        let lock = t.get(&key).map(|p| Arc::clone(&p.lock)).unwrap_or_default();
        t.insert(
            key.clone(),
            Pending {
                generation,
                container,
                lock: Arc::clone(&lock),
            },
        );
        lock
    };
    let client = client.clone();
    async move {
        write(&client, &pod, &key, generation, &lock, &status).await;
        if let Some(f) = &file {
            journal::finished(f);
        }
        let mut t = table();
        if t.get(&key).is_some_and(|p| p.generation == generation) {
            t.remove(&key);
        }
    }
}

/// Still the newest write of its pod (not superseded, not cancelled by a DEL).
fn current(key: &str, generation: u64) -> bool {
    table().get(key).is_some_and(|p| p.generation == generation)
}

async fn write(
    client: &KubeClient,
    pod: &PodIdentity,
    key: &str,
    generation: u64,
    lock: &tokio::sync::Mutex<()>,
    status: &str,
) {
    let started = Instant::now();
    let mut wait = Duration::from_millis(500);
    let mut warned = false;
    loop {
        let res = {
            let _one_at_a_time = lock.lock().await;
            if !current(key, generation) {
                tracing::debug!(pod = %key, "network-status write superseded or its container deleted");
                return;
            }
            // One request per attempt: the retries are this loop's, each after the check
            // above, so a DEL between two attempts stops them (the client's own retry would
            // send the PATCH of a DELeted container once the API server is back).
            client
                .set_network_status_with(
                    &pod.namespace,
                    &pod.name,
                    &pod.uid,
                    status,
                    RetryPolicy::none(),
                )
                .await
        };
        match res {
            Ok(()) => {
                tracing::debug!(pod = %key, elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "network-status written");
                return;
            }
            Err(e) if e.is_not_found() || matches!(e, K8sError::PodReplaced { .. }) => {
                tracing::warn!(pod = %key, error = %e, "network-status not written: the pod is gone");
                return;
            }
            Err(e) if started.elapsed() >= STATUS_RETRY_FOR => {
                tracing::error!(pod = %key, error = %e, "network-status never written: giving up, the pod runs without it");
                crate::outcome::sink().status_given_up();
                return;
            }
            Err(e) if e.is_transient() || warned => {
                tracing::warn!(pod = %key, error = %e, "network-status not written yet: retrying");
            }
            Err(e) => {
                // Refused (403, 422, …): the ADD cannot be undone any more. Say so once, and
                // keep retrying: a restarting apiserver answers 403 until its RBAC cache is
                // loaded, and RBAC can be fixed.
                warned = true;
                tracing::error!(pod = %key, error = %e, "network-status refused: retrying in the background");
                let r = PodRef {
                    ns: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: pod.uid.clone(),
                    node: String::new(),
                };
                let msg = format!("cannot write the network-status annotation (retrying): {e}");
                if let Err(e) = client
                    .post_event(&r, EventType::Warning, "NetworkStatusFailed", &msg)
                    .await
                {
                    tracing::warn!(pod = %key, error = %e, "event not posted");
                }
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(30));
    }
}

/// A DEL of `container`: drop its pod's pending write if it is that container's (a PATCH
/// already sent completes; one not yet sent is never sent).
pub fn cancel(container: &str) {
    table().retain(|_, p| p.container != container);
}

/// Wait until no write is pending, up to `deadline`; returns how many are left.
pub fn wait_idle(deadline: Instant) -> usize {
    loop {
        let n = pending_count();
        if n == 0 || Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_add_supersedes_and_a_del_cancels_its_containers_write() {
        let key = "h18-test/p".to_string();
        let reg = |generation: u64, c: &str| {
            table().insert(
                key.clone(),
                Pending {
                    generation,
                    container: c.into(),
                    lock: Default::default(),
                },
            );
        };
        reg(10, "c1");
        assert!(current(&key, 10));
        reg(11, "c2");
        assert!(!current(&key, 10), "superseded by the newer ADD");
        assert!(current(&key, 11));
        cancel("c1");
        assert!(
            current(&key, 11),
            "a DEL of the old container keeps the new write"
        );
        cancel("c2");
        assert!(!current(&key, 11), "a DEL of its container drops the write");
        assert_eq!(
            for_container("c3", "eth0", || CONTAINER.with(|c| c.borrow().clone())),
            ("c3".to_string(), "eth0".to_string())
        );
        assert!(CONTAINER.with(|c| c.borrow().0.is_empty()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_del_while_the_api_fails_stops_the_retries() {
        use crate::k8s::testutil::{json_response, MockApi};
        // The API server answers 503 (down behind a proxy, restarting): transient.
        let mock = MockApi::repeating(json_response(
            503,
            r#"{"kind":"Status","code":503,"message":"unavailable"}"#,
        ));
        let client = mock.client();
        let dir = tempfile::tempdir().unwrap();
        let pod = PodIdentity {
            namespace: "h-bg-del".into(),
            name: "p".into(),
            uid: "u1".into(),
            ..Default::default()
        };
        let write = for_container("c-del-retry", "eth0", || {
            write_later(&client, &pod, "[]".into(), dir.path())
        });
        let task = tokio::spawn(write);
        let first = Instant::now();
        while mock.requests().is_empty() {
            assert!(first.elapsed() < Duration::from_secs(5), "no PATCH sent");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cancel("c-del-retry");
        let at_cancel = mock.requests().len();
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("the write stops once its container is DELeted")
            .unwrap();
        // At most the attempt already under way when the DEL came.
        assert!(
            mock.requests().len() <= at_cancel + 1,
            "PATCHes after the DEL: {} then {}",
            at_cancel,
            mock.requests().len()
        );
        assert_eq!(
            std::fs::read_dir(dir.path().join("status-pending"))
                .unwrap()
                .count(),
            0
        );
    }
}
