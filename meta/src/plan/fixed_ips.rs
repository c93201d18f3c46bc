//! Fixed addresses of StatefulSet replicas at ADD: for each network the pod selects whose NAD
//! carries `plexus.cni.io/fixed-ips`, the mapping is validated against the network's config and
//! the replica's addresses (StatefulSet from the pod's controller `ownerReference`, ordinal from
//! the pod name's suffix) become the selection's `ips`, which the planner hands to the delegate
//! like a pod's own `ips` (`runtimeConfig.ips`, `CNI_ARGS IP=`). No I/O.

use super::requests::{NadMap, Requests};
use super::resolve;
use crate::error::MetaError;
use crate::pod::PodInfo;
use plexus_conf::error::CniError;
use plexus_conf::k8s::fixed_ips::{ordinal, FixedIps, Lookup, FIXED_IPS_ANNOTATION};
use std::path::Path;

/// `r` with each selected network's mapped addresses filled in. A network whose NAD has no
/// mapping, a pod that is no StatefulSet replica and a StatefulSet the mapping does not name are
/// left as they are (a standalone pod keeps its own `ips`).
pub fn apply(
    conf_dir: &Path,
    pod: Option<&PodInfo>,
    r: &Requests,
    nads: &NadMap,
) -> Result<Requests, MetaError> {
    let mut out = r.clone();
    let Some(pod) = pod else { return Ok(out) };
    let label = format!("pod {}", pod.id.key());
    let err = |source: CniError| MetaError::FixedIps {
        pod: label.clone(),
        source: source.into(),
    };
    for sel in &mut out.selected {
        let ns = sel.namespace_or(&pod.id.namespace).to_string();
        let Some(Some(data)) = nads.get(&(ns.clone(), sel.name.clone())) else {
            continue;
        };
        let Some(text) = data.fixed_ips.as_deref() else {
            continue;
        };
        let network = format!("{ns}/{}", sel.name);
        let mapping = FixedIps::parse(&network, text).map_err(err)?;
        let net = resolve::from_nad(&ns, &sel.name, data, conf_dir)?;
        mapping.check_against(&network, &net.list).map_err(err)?;
        let Some(set) = pod.statefulset.as_deref() else {
            continue;
        };
        let Some(ord) = ordinal(set, &pod.id.name) else {
            continue;
        };
        let Lookup::Addresses(addrs) = mapping.lookup(&network, set, ord).map_err(err)? else {
            continue;
        };
        if !sel.ips.is_empty() {
            return Err(err(CniError::invalid_config(
                format!("network {network}: the pod's networks annotation and {FIXED_IPS_ANNOTATION} both give it addresses"),
                format!("remove \"ips\" from the networks annotation of StatefulSet {set}'s pod template: the mapping gives each replica its own"),
            )));
        }
        tracing::debug!(pod = %pod.id.key(), %network, ordinal = ord, "fixed addresses from the NAD mapping");
        sel.ips = addrs.iter().map(|a| a.cidr.clone()).collect();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::resolve::NadData;
    use crate::pod::PodIdentity;
    use plexus_conf::k8s::selection::{parse_selections, NETWORKS_ANNOTATION};

    const MACVLAN: &str =
        r#"{"cniVersion":"1.0.0","name":"data","type":"macvlan","ipam":{"type":"static"}}"#;

    fn pod(name: &str, set: Option<&str>) -> PodInfo {
        PodInfo {
            id: PodIdentity {
                namespace: "db".into(),
                name: name.into(),
                ..Default::default()
            },
            statefulset: set.map(str::to_string),
            ..Default::default()
        }
    }

    fn nads(config: &str, mapping: Option<&str>) -> NadMap {
        [(
            ("db".to_string(), "data".to_string()),
            Some(NadData {
                config: config.into(),
                fixed_ips: mapping.map(str::to_string),
                ..Default::default()
            }),
        )]
        .into()
    }

    fn run(p: &PodInfo, sel: &str, nads: &NadMap) -> Result<Vec<String>, MetaError> {
        let r = Requests {
            selected: parse_selections(sel, NETWORKS_ANNOTATION).unwrap(),
            ..Default::default()
        };
        apply(Path::new("/nonexistent"), Some(p), &r, nads).map(|r| r.selected[0].ips.clone())
    }

    const MAP: &str =
        r#"{"mysql":["10.246.0.10/24","10.246.0.11/24","10.246.0.12/24","10.246.0.13/24"]}"#;

    #[test]
    fn each_replica_gets_its_ordinal_and_others_are_untouched() {
        let n = nads(MACVLAN, Some(MAP));
        for ord in 0..4 {
            let got = run(&pod(&format!("mysql-{ord}"), Some("mysql")), "data", &n).unwrap();
            assert_eq!(got, vec![format!("10.246.0.1{ord}/24")]);
        }
        // Not a replica, another set, a name that does not follow the set's: as without it.
        assert!(run(&pod("mysql-1", None), "data", &n).unwrap().is_empty());
        assert!(run(&pod("redis-1", Some("redis")), "data", &n)
            .unwrap()
            .is_empty());
        assert!(run(&pod("other-1", Some("mysql")), "data", &n)
            .unwrap()
            .is_empty());
        let own = run(
            &pod("app", None),
            r#"[{"name":"data","ips":["10.246.0.99/24"]}]"#,
            &n,
        );
        assert_eq!(own.unwrap(), vec!["10.246.0.99/24"]);
        // No mapping on the NAD: nothing changes.
        let plain = nads(MACVLAN, None);
        assert!(run(&pod("mysql-0", Some("mysql")), "data", &plain)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_owner_comes_from_the_pod_object_read_from_the_api() {
        let owned = |kind: &str, controller: bool| {
            let p = crate::k8s::pod_from_json(serde_json::json!({"metadata":{
                "name":"mysql-1","namespace":"db","ownerReferences":[
                    {"apiVersion":"apps/v1","kind":kind,"name":"mysql","uid":"u","controller":controller}]}}))
            .unwrap();
            PodInfo::from_pod(&p, &pod("mysql-1", None).id).statefulset
        };
        assert_eq!(owned("StatefulSet", true).as_deref(), Some("mysql"));
        assert_eq!(owned("StatefulSet", false), None);
        assert_eq!(owned("ReplicaSet", true), None);
    }

    #[test]
    fn misuse_is_a_clear_error_naming_pod_network_and_address() {
        let n = nads(MACVLAN, Some(MAP));
        // Replica 4 of a 5-replica set with 4 addresses mapped.
        let e = run(&pod("mysql-4", Some("mysql")), "data", &n).unwrap_err();
        assert!(
            matches!(&e, MetaError::FixedIps { pod, .. } if pod == "pod db/mysql-4"),
            "{e:?}"
        );
        assert_eq!(e.code(), 7);
        assert!(
            e.msg().contains("pod db/mysql-4")
                && e.msg().contains("db/data")
                && e.msg().contains("mysql-4"),
            "{e}"
        );
        // ips in the template and the mapping.
        let e = run(
            &pod("mysql-0", Some("mysql")),
            r#"[{"name":"data","ips":["10.246.0.99/24"]}]"#,
            &n,
        )
        .unwrap_err();
        assert!(e.details().contains("remove \"ips\""), "{e}");
        // Invalid mapping: refused for every pod of the network, before anything runs.
        let bad = nads(
            MACVLAN,
            Some(r#"{"mysql":["10.246.0.10/24","10.246.0.10/24"]}"#),
        );
        let e = run(&pod("app", None), "data", &bad).unwrap_err();
        assert!(e.details().contains("given twice"), "{e}");
        // The NAD's own static address would go to every replica.
        let fixed = nads(
            r#"{"cniVersion":"1.0.0","name":"data","type":"macvlan","ipam":{"type":"static","addresses":[{"address":"10.246.0.10/24"}]}}"#,
            Some(MAP),
        );
        let e = run(&pod("mysql-0", Some("mysql")), "data", &fixed).unwrap_err();
        assert!(e.details().contains("remove them"), "{e}");
        // Outside the host-local subnet.
        let hl = nads(
            r#"{"cniVersion":"1.0.0","name":"data","type":"macvlan","ipam":{"type":"host-local","subnet":"10.9.0.0/16"}}"#,
            Some(MAP),
        );
        let e = run(&pod("mysql-0", Some("mysql")), "data", &hl).unwrap_err();
        assert!(
            e.details().contains("10.246.0.10/24") && e.details().contains("10.9.0.0/16"),
            "{e}"
        );
    }
}
