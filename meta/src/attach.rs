//! Running a plan: ADD every attachment in order with an undo stack (a failure DELs what was
//! added, in reverse), DEL every attachment best-effort, CHECK every attachment.

use crate::plan::PlannedAttachment;
use crate::routes::{self, RouteChange};
use plexus_conf::args::CniArgs;
use plexus_conf::error::{code, CniError};
use plexus_conf::netconf::NetConfList;
use plexus_conf::result::{is_default_dst, is_v6, CniResult, Route};
use plexus_delegates::chain::combine;
use plexus_delegates::netns::{link_exists, NetNs};
use plexus_delegates::{Attachment, Runtime};

/// One attachment's outcome.
#[derive(Debug, Clone)]
pub struct Attached {
    /// Index in the plan.
    pub index: usize,
    /// The delegate's result (with default-route changes applied).
    pub result: CniResult,
}

fn attachment(
    container_id: &str,
    netns: &str,
    a: &PlannedAttachment,
) -> Result<Attachment, CniError> {
    Ok(Attachment {
        container_id: container_id.into(),
        netns: netns.into(),
        ifname: a.ifname.clone(),
        args: CniArgs::parse(&a.cni_args)?,
        capability_args: a.capability_args.clone(),
    })
}

fn ctx(pod: &str, a: &PlannedAttachment) -> String {
    format!("{pod}, network {} ({})", a.network, a.ifname)
}

/// Check that every plugin (and IPAM plugin) of the plan is installed, before anything runs.
pub fn validate_plugins(
    rt: &Runtime,
    plan: &[PlannedAttachment],
    pod: &str,
) -> Result<(), CniError> {
    for a in plan {
        let list = a.list()?;
        for p in &list.plugins {
            for t in std::iter::once(p.plugin_type()).chain(p.ipam_type()) {
                plexus_delegates::find_plugin(t, &rt.search_path)
                    .map_err(|e| e.context(format!("{}, network {}", pod, a.network)))?;
            }
        }
    }
    Ok(())
}

/// A failed ADD: the error, and whether the rollback removed everything.
#[derive(Debug)]
pub struct AddFailure {
    /// The CNI error to return.
    pub error: CniError,
    /// True when every rollback DEL succeeded.
    pub clean: bool,
}

/// ADD all attachments. On failure everything added so far (including the failed one, which
/// may have left partial state) is DELeted in reverse order; the error names the pod, the
/// network and the cause, plus any rollback failure.
pub fn add_all(
    rt: &Runtime,
    plan: &[PlannedAttachment],
    container_id: &str,
    netns: &str,
    pod: &str,
) -> Result<Vec<Attached>, AddFailure> {
    let ns = NetNs::open(netns).map_err(|e| AddFailure {
        error: CniError::new(
            code::UNKNOWN_CONTAINER,
            format!("{pod}: cannot open the pod network namespace"),
            e.to_string(),
        ),
        clean: true,
    })?;
    // Each attachment's config and CNI_ARGS are parsed once, for its ADD and its rollback.
    let prepared: Vec<(NetConfList, Attachment)> = plan
        .iter()
        .map(|a| Ok((a.list()?, attachment(container_id, netns, a)?)))
        .collect::<Result<_, CniError>>()
        .map_err(|e| AddFailure {
            error: e.context(pod),
            clean: true,
        })?;
    let mut undo: Vec<usize> = Vec::new();
    let mut done = Vec::new();
    for (i, (a, (list, att))) in plan.iter().zip(&prepared).enumerate() {
        let step = (|| -> Result<CniResult, CniError> {
            let exists = ns
                .run(|| link_exists(&a.ifname))
                .map_err(|e| CniError::internal("enter netns", e.to_string()))?;
            if exists {
                return Err(CniError::invalid_config(
                    format!("interface {} already exists in the pod", a.ifname),
                    "another network or a previous ADD created it",
                ));
            }
            undo.push(i);
            let mut result = rt.add(list, att)?;
            apply_routes(rt, a, &list.name, att, netns, &mut result)?;
            Ok(result)
        })();
        match step {
            Ok(result) => done.push(Attached { index: i, result }),
            Err(e) => {
                let failed = e.context(ctx(pod, a));
                let rollback: Vec<CniError> = undo
                    .iter()
                    .rev()
                    .filter_map(|&j| {
                        let (l, att) = &prepared[j];
                        rt.del(l, att)
                            .err()
                            .map(|e| e.context(format!("rollback of {}", ctx(pod, &plan[j]))))
                    })
                    .collect();
                if rollback.is_empty() {
                    return Err(AddFailure {
                        error: failed,
                        clean: true,
                    });
                }
                let details: Vec<String> = rollback.iter().map(ToString::to_string).collect();
                return Err(AddFailure {
                    error: CniError::new(
                        failed.code,
                        failed.msg,
                        format!(
                            "{}; rollback also failed: {}",
                            failed.details,
                            details.join(" / ")
                        ),
                    ),
                    clean: false,
                });
            }
        }
    }
    Ok(done)
}

/// Default-route changes for one attachment, reflected in its result and its cached result.
fn apply_routes(
    rt: &Runtime,
    a: &PlannedAttachment,
    network: &str,
    att: &Attachment,
    netns: &str,
    result: &mut CniResult,
) -> Result<(), CniError> {
    let gateways: Vec<std::net::IpAddr> = a
        .default_route
        .iter()
        .filter_map(|g| g.parse().ok())
        .collect();
    if !a.filter_v4 && !a.filter_v6 && gateways.is_empty() {
        return Ok(());
    }
    routes::apply(
        netns,
        &RouteChange {
            ifname: a.ifname.clone(),
            drop_v4: a.filter_v4,
            drop_v6: a.filter_v6,
            gateways: gateways.clone(),
        },
    )?;
    result.routes.retain(|r| {
        let v6 = is_v6(&r.dst);
        !(is_default_dst(&r.dst)
            && ((v6 && a.filter_v6)
                || (!v6 && a.filter_v4)
                || gateways.iter().any(|g| g.is_ipv6() == v6)))
    });
    for gw in &gateways {
        result.routes.push(Route {
            dst: if gw.is_ipv6() {
                "::/0".into()
            } else {
                "0.0.0.0/0".into()
            },
            gw: Some(gw.to_string()),
            ..Route::default()
        });
    }
    // Keep the delegate's cached result in step, so CHECK and DEL see the routes as they are.
    if let Some(cache) = &rt.cache {
        if let Some(mut entry) = cache.load(network, &att.container_id, &att.ifname) {
            let ver = entry
                .result
                .as_ref()
                .and_then(|r| r.get("cniVersion"))
                .and_then(|v| v.as_str())
                .unwrap_or("1.0.0")
                .to_string();
            let mut cached = result.clone();
            cached.cni_version = ver.clone();
            if let Ok(v) = cached.to_value(&ver) {
                entry.result = Some(v);
                cache.store(&entry)?;
            }
        }
    }
    Ok(())
}

/// DEL every attachment in reverse order; all are attempted and the errors combined.
/// `netns` may be empty or gone: delegates then release what they can (IPAM leases).
pub fn del_all(
    rt: &Runtime,
    plan: &[PlannedAttachment],
    container_id: &str,
    netns: &str,
    pod: &str,
) -> Result<(), CniError> {
    // A netns path that no longer exists is passed as empty, as the runtime would.
    let netns = if !netns.is_empty() && NetNs::open(netns).is_err() {
        ""
    } else {
        netns
    };
    let errors: Vec<CniError> = plan
        .iter()
        .rev()
        .filter_map(|a| {
            let res = a
                .list()
                .and_then(|l| attachment(container_id, netns, a).and_then(|att| rt.del(&l, &att)));
            res.err().map(|e| e.context(ctx(pod, a)))
        })
        .collect();
    combine(errors).map_or(Ok(()), Err)
}

/// CHECK every attachment (Multus checks only static delegates).
pub fn check_all(
    rt: &Runtime,
    plan: &[PlannedAttachment],
    container_id: &str,
    netns: &str,
    pod: &str,
) -> Result<(), CniError> {
    for a in plan {
        let list = a.list()?;
        // CHECK does not exist before 0.4.0: such networks are skipped, not failed.
        if rt.negotiate(&list).is_ok_and(|v| !v.has_check()) {
            tracing::debug!(network = %a.network, "CHECK skipped: network version predates CHECK");
            continue;
        }
        let att = attachment(container_id, netns, a)?;
        rt.check(&list, &att).map_err(|e| e.context(ctx(pod, a)))?;
    }
    Ok(())
}

/// Drop the delegates' cached results of a plan (when DEL gives up on it).
pub fn forget_results(rt: &Runtime, plan: &[PlannedAttachment], container_id: &str) {
    let Some(cache) = &rt.cache else { return };
    for a in plan {
        if let Ok(list) = a.list() {
            let _ = cache.remove(&list.name, container_id, &a.ifname);
        }
    }
}
