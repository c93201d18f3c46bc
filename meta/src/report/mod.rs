//! Stage 4 of ADD and DEL: tell Kubernetes what happened — the pod's
//! `k8s.v1.cni.cncf.io/network-status` (one merge PATCH), one summary event, and the DRA
//! claims' `networkData` ([`claims`]).
//!
//! Thin mode does all of it inside the call. In daemon mode events are posted in the
//! background (they never delay the runtime), and a transient failure of the status PATCH is
//! retried in the background instead of undoing the attachments ([`spawn_status_retry`]).

pub mod background;
pub mod claims;
pub mod journal;

use crate::attach::Attached;
use crate::context::Ctx;
use crate::error::MetaError;
use crate::k8s::{EventType, K8sError, KubeClient, PodRef};
use crate::plan::PlannedAttachment;
use crate::pod::PodInfo;
use plexus_conf::k8s::network_status::{statuses_from_result, to_annotation, NetworkStatus};
use std::time::Duration;

/// How long the daemon keeps retrying a network-status PATCH that failed transiently.
pub const STATUS_RETRY_FOR: Duration = Duration::from_secs(300);

/// One line per attachment: `net1 [10.1.1.5/24] from db/mv`.
pub fn summary(plan: &[PlannedAttachment], done: &[Attached]) -> String {
    done.iter()
        .map(|d| {
            let a = &plan[d.index];
            let ips: Vec<&str> = d.result.ips.iter().map(|i| i.address.as_str()).collect();
            format!("{} [{}] from {}", a.ifname, ips.join(","), a.network)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The network-status entries for a finished ADD.
pub fn network_status(plan: &[PlannedAttachment], done: &[Attached]) -> Vec<NetworkStatus> {
    done.iter()
        .flat_map(|d| {
            let a = &plan[d.index];
            let info = device_info(a);
            statuses_from_result(&a.network, &d.result, a.is_default, info.as_ref())
        })
        .collect()
}

/// NPWG device-info for an attachment that uses a device: its device-info file as the
/// delegate left it, else a `pci` document for the PCI address in its config (the NAD's, or
/// the allocated device). DPDK applications read their VF's address from it.
pub fn device_info(a: &PlannedAttachment) -> Option<serde_json::Value> {
    crate::devices::devinfo::read(a)
}

/// Post one event about `pod` (unless events are off). Failures are logged, never returned.
pub fn event(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    pod: Option<&PodInfo>,
    t: EventType,
    reason: &str,
    msg: &str,
) {
    if let Some(fut) = event_future(ctx, client, pod, t, reason, msg) {
        // The daemon posts in the background; a thin call waits (its process ends with it).
        ctx.run_or_spawn(fut);
    }
}

/// The POST of one event about `pod`, not started; `None` when events are off or there is no
/// API or pod. Failures are logged, never returned.
fn event_future(
    ctx: &Ctx,
    client: Option<&KubeClient>,
    pod: Option<&PodInfo>,
    t: EventType,
    reason: &str,
    msg: &str,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    if !ctx.config.events {
        return None;
    }
    let (Some(client), Some(p)) = (client, pod) else {
        return None;
    };
    let r = PodRef {
        ns: p.id.namespace.clone(),
        name: p.id.name.clone(),
        uid: p.id.uid.clone(),
        node: p
            .claims
            .as_ref()
            .map(|c| c.node_name.clone())
            .unwrap_or_default(),
    };
    let (client, reason, msg) = (client.clone(), reason.to_string(), msg.to_string());
    Some(async move {
        if let Err(e) = client.post_event(&r, t, &reason, &msg).await {
            tracing::warn!(pod = %format!("{}/{}", r.ns, r.name), error = %e, "event not posted");
        }
    })
}

/// Why the network-status could not be written (the attachments themselves are fine). ADD
/// reports [`StatusFailure::Api`] as [`MetaError::StatusWrite`] and a
/// [`StatusFailure::NotSent`] as its own error.
#[derive(Debug)]
pub enum StatusFailure {
    /// The API server refused the PATCH, or failed it for good.
    Api(K8sError),
    /// The PATCH could not be sent: the call's async runtime did not start
    /// ([`MetaError::Runtime`]).
    NotSent(Box<MetaError>),
}

/// After a successful attach: write network-status, the claims' network data and the
/// summary event. `Err` only when the status could not be written and will not be retried:
/// the caller then undoes the attachments, so a pod never looks single-homed for good.
///
/// A thin call sends the status PATCH and the `AddedInterface` event at the same time (the
/// two API writes overlap instead of adding up); if the PATCH then fails for good, a warning
/// event says the interfaces are being removed.
pub fn added(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    pod: Option<&PodInfo>,
    plan: &[PlannedAttachment],
    done: &[Attached],
) -> Result<(), StatusFailure> {
    let mut added_event = event_future(
        ctx,
        client,
        pod,
        EventType::Normal,
        "AddedInterface",
        &format!("Added {}", summary(plan, done)),
    );
    if let (Some(client), Some(p)) = (client, pod) {
        let status = to_annotation(&network_status(plan, done));
        if ctx.in_daemon() && background::background() {
            // Daemon mode: the PATCH follows the answer (report/background.rs: ordering per pod,
            // retries, what a reader sees).
            let cni_dir = std::path::PathBuf::from(&ctx.config.cni_dir);
            ctx.spawn_detached(background::write_later(client, &p.id, status, &cni_dir));
            return finish_added(ctx, Some(client), plan, done, added_event);
        }
        let patch = client.set_network_status(&p.id.namespace, &p.id.name, &p.id.uid, &status);
        let alongside = if ctx.in_daemon() {
            None
        } else {
            added_event.take()
        };
        let res = match alongside {
            Some(ev) => {
                let _phase = plexus_delegates::timing::phase("status_and_event");
                ctx.block_on(futures::future::join(patch, ev))
                    .map(|(r, ())| r)
            }
            None => ctx.block_on(patch),
        }
        .map_err(|e| StatusFailure::NotSent(Box::new(e)))?;
        match res {
            Ok(()) => {}
            Err(e) if e.is_not_found() || matches!(e, K8sError::PodReplaced { .. }) => {
                tracing::warn!(pod = %p.id.key(), error = %e, "network-status not written: the pod is gone");
            }
            Err(e) if e.is_transient() && spawn_status_retry(ctx, client, p, status.clone()) => {
                tracing::warn!(pod = %p.id.key(), error = %e, "network-status not written yet: retrying in the background");
            }
            Err(e) => {
                if added_event.is_none() {
                    event(
                        ctx,
                        Some(client),
                        pod,
                        EventType::Warning,
                        "AddInterfaceFailed",
                        &format!("cannot write the network-status annotation ({e}): removing the interfaces"),
                    );
                }
                return Err(StatusFailure::Api(e));
            }
        }
    }
    finish_added(ctx, client, plan, done, added_event)
}

/// The claims' network data and the `AddedInterface` event, after the status.
fn finish_added(
    ctx: &mut Ctx,
    client: Option<&KubeClient>,
    plan: &[PlannedAttachment],
    done: &[Attached],
    added_event: Option<impl std::future::Future<Output = ()> + Send + 'static>,
) -> Result<(), StatusFailure> {
    if let Some(client) = client {
        claims::write_network_data(ctx, client, plan, done);
    }
    if let Some(ev) = added_event {
        ctx.run_or_spawn(ev);
    }
    Ok(())
}

/// Daemon mode: keep PATCHing the network-status in the background (backoff 0.5 s → 30 s,
/// for [`STATUS_RETRY_FOR`]) until it is written or the pod is gone. `false` in thin mode.
pub fn spawn_status_retry(ctx: &Ctx, client: &KubeClient, pod: &PodInfo, status: String) -> bool {
    let client = client.clone();
    let id = pod.id.clone();
    ctx.spawn_detached(async move {
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(500);
        loop {
            tokio::time::sleep(wait).await;
            match client
                .set_network_status(&id.namespace, &id.name, &id.uid, &status)
                .await
            {
                Ok(()) => {
                    tracing::info!(pod = %id.key(), "network-status written after a retry");
                    return;
                }
                Err(e) if e.is_not_found() || matches!(e, K8sError::PodReplaced { .. }) => return,
                Err(e) if started.elapsed() > STATUS_RETRY_FOR => {
                    tracing::error!(pod = %id.key(), error = %e, "network-status never written: giving up");
                    crate::outcome::sink().status_given_up();
                    return;
                }
                Err(e) => tracing::debug!(pod = %id.key(), error = %e, "network-status retry failed"),
            }
            wait = (wait * 2).min(Duration::from_secs(30));
        }
    })
}
