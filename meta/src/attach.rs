//! Running a plan: ADD every attachment in order with an undo stack (a failure DELs what was
//! added, in reverse), DEL every attachment best-effort, CHECK every attachment.
//!
//! Stage 3: takes the plan's [`PlannedAttachment`]s and the delegate runtime; gives an
//! [`Attached`] per attachment (the delegate's result) for the report stage, or an error
//! after the undo.

use crate::error::MetaError;
use crate::plan::PlannedAttachment;
use crate::routes::{self, RouteChange};
use plexus_conf::args::CniArgs;
use plexus_conf::netconf::NetConfList;
use plexus_conf::result::{is_default_dst, is_v6, CniResult, Route};
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
) -> Result<Attachment, MetaError> {
    Ok(Attachment {
        container_id: container_id.into(),
        netns: netns.into(),
        ifname: a.ifname.clone(),
        args: CniArgs::parse(&a.cni_args).map_err(|source| MetaError::CniArgs {
            source: source.into(),
        })?,
        capability_args: a.capability_args.clone(),
    })
}

/// `e` as the failure of attachment `a` of `pod`'s plan.
fn failed(pod: &str, a: &PlannedAttachment, e: MetaError) -> MetaError {
    MetaError::Attachment {
        pod: pod.to_string(),
        network: a.network.clone(),
        ifname: a.ifname.clone(),
        source: Box::new(e),
    }
}

/// Check that every plugin (and IPAM plugin) of the plan is installed, before anything runs.
pub fn validate_plugins(
    rt: &Runtime,
    plan: &[PlannedAttachment],
    pod: &str,
) -> Result<(), MetaError> {
    for a in plan {
        let list = a.list()?;
        for p in &list.plugins {
            for t in std::iter::once(p.plugin_type()).chain(p.ipam_type()) {
                plexus_delegates::find_plugin(t, &rt.search_path).map_err(|source| {
                    MetaError::PluginMissing {
                        pod: pod.to_string(),
                        network: a.network.clone(),
                        source: source.into(),
                    }
                })?;
            }
        }
    }
    Ok(())
}

/// Whether a failed [`add_all`] left nothing behind: every rollback DEL succeeded (any error
/// but [`MetaError::RollbackFailed`]).
pub fn rolled_back_cleanly(e: &MetaError) -> bool {
    !matches!(e, MetaError::RollbackFailed { .. })
}

/// ADD all attachments. On failure everything added so far (including the failed one, which
/// may have left partial state) is DELeted in reverse order; the error names the pod, the
/// network and the interface ([`MetaError::Attachment`]) and the cause, plus any rollback
/// failure ([`MetaError::RollbackFailed`], see [`rolled_back_cleanly`]).
pub fn add_all(
    rt: &Runtime,
    plan: &[PlannedAttachment],
    container_id: &str,
    netns: &str,
    pod: &str,
) -> Result<Vec<Attached>, MetaError> {
    let prep = plexus_delegates::timing::phase("attach_prep");
    let ns = NetNs::open(netns).map_err(|source| MetaError::NetnsOpen {
        pod: pod.to_string(),
        source,
    })?;
    // Each attachment's config and CNI_ARGS are parsed once, for its ADD and its rollback.
    let prepared: Vec<(NetConfList, Attachment)> = plan
        .iter()
        .map(|a| Ok((a.list()?, attachment(container_id, netns, a)?)))
        .collect::<Result<_, MetaError>>()
        .map_err(|e| MetaError::PlanInvalid {
            pod: pod.to_string(),
            source: Box::new(e),
        })?;
    drop(prep);
    // Every interface name is checked before anything runs, in one visit to the namespace (a
    // thread that enters it): an existing one fails the ADD with nothing to undo.
    if let Some(first) = plan.first() {
        let taken = ns
            .run(|| plan.iter().find(|a| link_exists(&a.ifname)))
            .map_err(|source| failed(pod, first, MetaError::NetnsEnter { source }))?;
        if let Some(a) = taken {
            let e = MetaError::InterfaceExists {
                ifname: a.ifname.clone(),
            };
            return Err(failed(pod, a, e));
        }
    }
    let mut undo: Vec<usize> = Vec::new();
    let mut done = Vec::new();
    for (i, (a, (list, att))) in plan.iter().zip(&prepared).enumerate() {
        let step = (|| -> Result<CniResult, MetaError> {
            // No common version (the plugins' VERSION answers): no plugin of this network ran,
            // so it has nothing to roll back (its DEL would fail the same way).
            let ver = rt.negotiate(list).map_err(|source| MetaError::Delegate {
                source: source.into(),
            })?;
            undo.push(i);
            let mut result = rt
                .add_at(list, att, ver)
                .map_err(|source| MetaError::Delegate {
                    source: source.into(),
                })?;
            apply_routes(rt, a, &list.name, att, netns, &mut result)?;
            Ok(result)
        })();
        match step {
            Ok(result) => done.push(Attached { index: i, result }),
            Err(e) => {
                let error = failed(pod, a, e);
                let rollback: Vec<MetaError> = undo
                    .iter()
                    .rev()
                    .filter_map(|&j| {
                        let (l, att) = &prepared[j];
                        rt.del(l, att).err().map(|source| MetaError::Rollback {
                            pod: pod.to_string(),
                            network: plan[j].network.clone(),
                            ifname: plan[j].ifname.clone(),
                            source: source.into(),
                        })
                    })
                    .collect();
                if rollback.is_empty() {
                    return Err(error);
                }
                return Err(MetaError::RollbackFailed {
                    source: Box::new(error),
                    rollback,
                });
            }
        }
    }
    routes::dad::settle(
        netns,
        done.iter()
            .map(|d| (plan[d.index].ifname.as_str(), &d.result)),
    );
    announce(&ns, plan, &prepared, &done);
    Ok(done)
}

/// The addresses of attachments whose addresses were asked for (a pod's `ips`, a StatefulSet
/// replica's fixed address, static IPAM) announced on their interfaces (gratuitous ARP,
/// unsolicited NA), in one visit to the pod's netns with one socket per family
/// ([`plexus_delegates::announce`]). Such an address may have been another pod's a moment ago,
/// at another MAC: its peers follow at once. Pooled addresses are not announced (announcing
/// costs an RCU grace period when the socket closes). Best effort: a failure is logged.
fn announce(
    ns: &NetNs,
    plan: &[PlannedAttachment],
    prepared: &[(NetConfList, Attachment)],
    done: &[Attached],
) {
    let todo: Vec<(&str, Vec<std::net::IpAddr>)> = done
        .iter()
        .filter(|d| addresses_requested(&plan[d.index], &prepared[d.index].0))
        .map(|d| {
            let ips = d
                .result
                .ips
                .iter()
                .filter_map(|ip| ip.address.split('/').next()?.parse().ok())
                .collect();
            (plan[d.index].ifname.as_str(), ips)
        })
        .filter(|(_, ips): &(&str, Vec<std::net::IpAddr>)| !ips.is_empty())
        .collect();
    if todo.is_empty() {
        return;
    }
    let _phase = plexus_delegates::timing::phase("announce");
    let sent = ns.run(|| {
        let mut announcer = plexus_delegates::announce::Announcer::default();
        let results = todo
            .iter()
            .map(|(ifname, ips)| (*ifname, announcer.announce(ifname, ips)))
            .collect::<Vec<_>>();
        (results, announcer)
    });
    match sent {
        Ok((results, announcer)) => {
            // Closing its packet socket waits 7-15 ms for an RCU grace period.
            announcer.close_in_background();
            for (ifname, r) in results {
                match r {
                    Ok(n) => tracing::debug!(ifname, announced = n, "neighbour announcement"),
                    Err(e) => tracing::warn!(ifname, error = %e, "neighbour announcement not sent"),
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "neighbour announcement: cannot enter the pod's netns")
        }
    }
}

/// Whether `a`'s addresses were chosen rather than drawn from a pool: the pod's (or a
/// StatefulSet mapping's) `ips`, or static IPAM in one of its plugins.
fn addresses_requested(a: &PlannedAttachment, list: &NetConfList) -> bool {
    a.capability_args.contains_key("ips")
        || a.cni_args.split(';').any(|kv| kv.starts_with("IP="))
        || list.plugins.iter().any(|p| p.ipam_type() == Some("static"))
}

/// Default-route changes for one attachment, reflected in its result and its cached result.
fn apply_routes(
    rt: &Runtime,
    a: &PlannedAttachment,
    network: &str,
    att: &Attachment,
    netns: &str,
    result: &mut CniResult,
) -> Result<(), MetaError> {
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
                cache
                    .store(&entry)
                    .map_err(|source| MetaError::ResultCache {
                        source: source.into(),
                    })?;
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
) -> Result<(), MetaError> {
    // A netns path that no longer exists is passed as empty, as the runtime would.
    let netns = if !netns.is_empty() && NetNs::open(netns).is_err() {
        ""
    } else {
        netns
    };
    let errors: Vec<MetaError> = plan
        .iter()
        .rev()
        .filter_map(|a| {
            let res = a.list().and_then(|l| {
                let att = attachment(container_id, netns, a)?;
                rt.del(&l, &att).map_err(|source| MetaError::Delegate {
                    source: source.into(),
                })
            });
            res.err().map(|e| failed(pod, a, e))
        })
        .collect();
    MetaError::combine(errors).map_or(Ok(()), Err)
}

/// CHECK every attachment (Multus checks only static delegates).
pub fn check_all(
    rt: &Runtime,
    plan: &[PlannedAttachment],
    container_id: &str,
    netns: &str,
    pod: &str,
) -> Result<(), MetaError> {
    for a in plan {
        let list = a.list()?;
        // CHECK does not exist before 0.4.0: such networks are skipped, not failed.
        if rt.negotiate(&list).is_ok_and(|v| !v.has_check()) {
            tracing::debug!(network = %a.network, "CHECK skipped: network version predates CHECK");
            continue;
        }
        let att = attachment(container_id, netns, a)?;
        rt.check(&list, &att).map_err(|source| {
            failed(
                pod,
                a,
                MetaError::Delegate {
                    source: source.into(),
                },
            )
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_conf::error::CniError;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    use std::time::Duration;

    /// A plugin that answers ADD with an empty result or `add_fail`, and DEL with nothing or
    /// `del_fail` (a CNI error printed with exit status 1).
    fn plugin(dir: &Path, name: &str, add_fail: Option<&str>, del_fail: Option<&str>) {
        let ok = r#"{"cniVersion":"1.0.0"}"#;
        let answer = |fail: Option<&str>, ok: &str| match fail {
            Some(e) => format!("echo '{e}'; exit 1"),
            None => format!("echo '{ok}'"),
        };
        let body = format!(
            "#!/bin/sh\ncat >/dev/null\ncase \"$CNI_COMMAND\" in\n  ADD) {};;\n  DEL) {};;\n  VERSION) echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"1.0.0\"]}}';;\nesac\n",
            answer(add_fail, ok),
            answer(del_fail, ""),
        );
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn attachment(network: &str, ifname: &str, plugin: &str) -> PlannedAttachment {
        PlannedAttachment {
            ifname: ifname.into(),
            is_default: ifname == "eth0",
            cni_args: "IgnoreUnknown=1".into(),
            ..PlannedAttachment::for_test(
                network,
                json!({"cniVersion":"1.0.0","name":network.rsplit('/').next(),"type":plugin}),
            )
        }
    }

    fn runtime(dir: &Path) -> Runtime {
        Runtime {
            search_path: vec![dir.to_path_buf()],
            timeout: Duration::from_secs(10),
            cache: None,
        }
    }

    /// ADD runs in this process' own namespace (interface names that do not exist here);
    /// entering it needs CAP_SYS_ADMIN, as every test that enters a namespace.
    fn own_netns() -> Option<&'static str> {
        nix::unistd::geteuid()
            .is_root()
            .then_some("/proc/self/ns/net")
    }

    #[test]
    fn a_failed_add_rolls_back_and_names_what_failed() {
        let Some(netns) = own_netns() else {
            eprintln!("skipped: needs root to enter a network namespace");
            return;
        };
        let t = tempfile::tempdir().unwrap();
        plugin(t.path(), "good", None, None);
        plugin(
            t.path(),
            "bad",
            Some(r#"{"code":42,"msg":"no lease","details":"pool empty"}"#),
            None,
        );
        plugin(
            t.path(),
            "sticky",
            None,
            Some(r#"{"code":11,"msg":"busy","details":"try later"}"#),
        );
        let rt = runtime(t.path());
        let pod = "pod db/p";

        // A clean rollback: the failure itself, with its delegate's code.
        let plan = vec![
            attachment("cbr0", "plxt0", "good"),
            attachment("db/mv", "plxt1", "bad"),
        ];
        let e = add_all(&rt, &plan, "c1", netns, pod).unwrap_err();
        assert!(rolled_back_cleanly(&e));
        match &e {
            MetaError::Attachment {
                pod,
                network,
                ifname,
                source,
            } => {
                assert_eq!(
                    (pod.as_str(), network.as_str(), ifname.as_str()),
                    ("pod db/p", "db/mv", "plxt1")
                );
                assert!(
                    matches!(&**source, MetaError::Delegate { source } if source.code == 42),
                    "{source:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        let c = CniError::from(e);
        assert_eq!(c.code, 42);
        assert!(
            c.msg.starts_with("pod db/p, network db/mv (plxt1): ") && c.msg.ends_with("no lease"),
            "{c}"
        );

        // A rollback DEL that fails too: the rollback failures ride along, not clean.
        let plan = vec![
            attachment("cbr0", "plxt0", "sticky"),
            attachment("db/mv", "plxt1", "bad"),
        ];
        let e = add_all(&rt, &plan, "c2", netns, pod).unwrap_err();
        assert!(!rolled_back_cleanly(&e));
        match &e {
            MetaError::RollbackFailed { source, rollback } => {
                assert!(
                    matches!(&**source, MetaError::Attachment { network, .. } if network == "db/mv")
                );
                assert_eq!(rollback.len(), 1);
                assert!(
                    matches!(&rollback[0], MetaError::Rollback { network, source, .. }
                        if network == "cbr0" && source.code == 11),
                    "{rollback:?}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(e.code(), 42);
        assert!(
            e.details()
                .contains("rollback also failed: rollback of pod db/p, network cbr0 (plxt0)"),
            "{e}"
        );

        // Everything fine: one result per attachment.
        let plan = vec![attachment("cbr0", "plxt0", "good")];
        assert_eq!(add_all(&rt, &plan, "c3", netns, pod).unwrap().len(), 1);
    }

    #[test]
    fn add_refuses_a_gone_netns_and_del_combines_every_failure() {
        let t = tempfile::tempdir().unwrap();
        plugin(t.path(), "good", None, None);
        plugin(
            t.path(),
            "sticky",
            None,
            Some(r#"{"code":11,"msg":"busy","details":"try later"}"#),
        );
        let rt = runtime(t.path());
        let plan = vec![
            attachment("cbr0", "eth0", "sticky"),
            attachment("db/mv", "net1", "sticky"),
            attachment("db/ok", "net2", "good"),
        ];
        let f = add_all(
            &rt,
            &plan,
            "c1",
            "/run/netns/plexus-never-existed",
            "pod db/p",
        )
        .unwrap_err();
        assert!(rolled_back_cleanly(&f));
        assert!(
            matches!(&f, MetaError::NetnsOpen { pod, source } if pod == "pod db/p" && source.is_not_found()),
            "{f:?}"
        );
        assert_eq!(f.code(), 3);

        // DEL attempts every attachment (reverse order) and reports all failures.
        let e = del_all(&rt, &plan, "c1", "", "pod db/p").unwrap_err();
        let MetaError::Combined(all) = &e else {
            panic!("{e:?}")
        };
        let networks: Vec<&str> = all
            .iter()
            .map(|e| match e {
                MetaError::Attachment { network, .. } => network.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(networks, vec!["db/mv", "cbr0"]);
        assert_eq!(e.code(), 11);

        // A plugin that is not installed is found before anything runs.
        let e =
            validate_plugins(&rt, &[attachment("db/x", "net1", "nope")], "pod db/p").unwrap_err();
        assert!(
            matches!(&e, MetaError::PluginMissing { network, .. } if network == "db/x"),
            "{e:?}"
        );
        assert_eq!(e.code(), 7);
        // A planned config that is not a valid conflist.
        let mut broken = attachment("db/y", "net1", "good");
        broken.config = json!({"cniVersion":"1.0.0","name":"y"});
        assert!(matches!(
            validate_plugins(&rt, &[broken], "pod db/p").unwrap_err(),
            MetaError::NetworkConfig { .. }
        ));
    }
}
