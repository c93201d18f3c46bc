//! From config + pod to a plan: which networks the pod asks for (annotations, default-network
//! override, `defaultNetworks`, isolation), which NADs must be fetched, and the final plan once
//! they are. No I/O except reading config files named by the config.

use super::resolve::{self, NadData, NetRef};
use super::{PlanInput, PlannedAttachment, ResolvedNetwork};
use crate::error::MetaError;
use crate::plan;
use crate::pod::PodInfo;
use plexus_conf::args::CniArgs;
use plexus_conf::error::CniError;
use plexus_conf::k8s::nad::find_by_name;
use plexus_conf::k8s::selection::{
    parse_selections, NetworkSelection, DEFAULT_NETWORK_ANNOTATION, NETWORKS_ANNOTATION,
};
use plexus_conf::plexus_config::PlexusConfig;
use std::collections::HashMap;
use std::path::Path;

/// Fetched NADs by `(namespace, name)`; `None` = not found.
pub type NadMap = HashMap<(String, String), Option<NadData>>;

/// What a pod asks for, before NADs are fetched.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    /// Default network override from the pod annotation.
    pub default_override: Option<NetworkSelection>,
    /// `clusterNetwork`, classified (None: use `delegates[0]`).
    pub cluster: Option<NetRef>,
    /// `defaultNetworks` that apply to this pod.
    pub always: Vec<NetRef>,
    /// Annotation selections.
    pub selected: Vec<NetworkSelection>,
}

fn pod_label(pod: Option<&PodInfo>) -> String {
    pod.map(|p| format!("pod {}", p.id.key()))
        .unwrap_or_else(|| "static delegates".into())
}

/// Parse the pod's requests and enforce namespace isolation.
pub fn requests(config: &PlexusConfig, pod: Option<&PodInfo>) -> Result<Requests, MetaError> {
    let mut r = Requests {
        cluster: (!config.cluster_network.is_empty())
            .then(|| resolve::classify(&config.cluster_network, &config.multus_namespace)),
        ..Requests::default()
    };
    // Being uninstalled: what the node will give once plexus' config is gone, the cluster
    // network alone (the ADD tells the pod, see `verbs::add`).
    if config.uninstalling {
        return Ok(r);
    }
    let in_system_ns = pod.is_some_and(|p| config.system_namespaces.contains(&p.id.namespace));
    if !in_system_ns {
        r.always = config
            .default_networks
            .iter()
            .map(|v| resolve::classify(v, &config.multus_namespace))
            .collect();
    }
    let Some(pod) = pod else { return Ok(r) };
    let invalid = |source: CniError| MetaError::Annotation {
        pod: pod.id.key(),
        source: source.into(),
    };
    if let Some(v) = pod.annotations.get(DEFAULT_NETWORK_ANNOTATION) {
        let mut sels = parse_selections(v, DEFAULT_NETWORK_ANNOTATION).map_err(invalid)?;
        if sels.len() > 1 {
            // Worded like plexus-conf's own annotation errors.
            return Err(invalid(CniError::invalid_config(
                format!("invalid annotation {DEFAULT_NETWORK_ANNOTATION}"),
                "it must name exactly one network",
            )));
        }
        if let Some(mut s) = sels.pop() {
            if s.namespace.as_deref().is_none_or(str::is_empty) {
                s.namespace = Some(config.multus_namespace.clone());
            }
            if config.namespace_isolation {
                // The operator's namespace is always allowed for the default network.
                let mut allowed = config.global_namespace_list();
                allowed.push(config.multus_namespace.clone());
                plan::check_isolation(
                    &pod.id.namespace,
                    std::slice::from_ref(&s),
                    &allowed,
                    &pod.id.key(),
                )?;
            }
            r.default_override = Some(s);
        }
    }
    if let Some(v) = pod.annotations.get(NETWORKS_ANNOTATION) {
        r.selected = parse_selections(v, NETWORKS_ANNOTATION).map_err(invalid)?;
        if config.namespace_isolation {
            plan::check_isolation(
                &pod.id.namespace,
                &r.selected,
                &config.global_namespace_list(),
                &pod.id.key(),
            )?;
        }
    }
    Ok(r)
}

/// The NADs to fetch for these requests, deduplicated, in first-use order.
pub fn nad_refs(r: &Requests, pod_ns: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |ns: &str, name: &str| {
        let k = (ns.to_string(), name.to_string());
        if !out.contains(&k) {
            out.push(k);
        }
    };
    if let Some(s) = &r.default_override {
        push(s.namespace_or(pod_ns), &s.name);
    } else if let Some(NetRef::Nad { ns, name, .. }) = &r.cluster {
        push(ns, name);
    }
    for a in &r.always {
        if let NetRef::Nad { ns, name, .. } = a {
            push(ns, name);
        }
    }
    for s in &r.selected {
        push(s.namespace_or(pod_ns), &s.name);
    }
    out
}

fn resolve_ref(
    rf: &NetRef,
    nads: &NadMap,
    conf_dir: &Path,
    pod: &str,
) -> Result<ResolvedNetwork, MetaError> {
    match rf {
        NetRef::Path(p) => resolve::load_path(p).map(|list| ResolvedNetwork {
            name: list.name.clone(),
            list,
            resource_name: None,
            nad: None,
        }),
        NetRef::Nad {
            ns,
            name,
            conf_fallback,
        } => match nads.get(&(ns.clone(), name.clone())) {
            Some(Some(data)) => resolve::from_nad(ns, name, data, conf_dir),
            _ if *conf_fallback => find_by_name(name, &resolve::read_conf_dir(conf_dir))
                .map(|list| ResolvedNetwork {
                    name: list.name.clone(),
                    list,
                    resource_name: None,
                    nad: None,
                })
                .ok_or_else(|| MetaError::NetworkNotFound {
                    pod: pod.to_string(),
                    ns: ns.clone(),
                    name: name.clone(),
                    conf_dir: conf_dir.to_path_buf(),
                }),
            _ => Err(resolve::not_found(ns, name, pod)),
        },
    }
}

/// A network the operator chose (`clusterNetwork`, `defaultNetworks`), even when it is a NAD:
/// not subject to the NAD policy.
fn operator_network(mut net: ResolvedNetwork) -> ResolvedNetwork {
    net.nad = None;
    net
}

/// Build the plan from requests and fetched NADs.
pub fn make_plan(
    config: &PlexusConfig,
    ifname: &str,
    cni_args: &CniArgs,
    pod: Option<&PodInfo>,
    r: &Requests,
    nads: &NadMap,
    devices: Option<&crate::plan::DeviceMap>,
) -> Result<Vec<PlannedAttachment>, MetaError> {
    let label = pod_label(pod);
    let conf_dir = Path::new(&config.conf_dir);
    let pod_ns = pod.map(|p| p.id.namespace.as_str()).unwrap_or("");
    let statics = config
        .delegate_lists()
        .map_err(|source| MetaError::Config {
            source: source.into(),
        })?;
    let mut always: Vec<ResolvedNetwork> = Vec::new();
    let default = if let Some(s) = &r.default_override {
        let ns = s.namespace_or(pod_ns);
        let rf = NetRef::Nad {
            ns: ns.into(),
            name: s.name.clone(),
            conf_fallback: false,
        };
        (
            resolve_ref(&rf, nads, conf_dir, &label)?,
            s.requested_interface().map(str::to_string),
        )
    } else if let Some(rf) = &r.cluster {
        (
            operator_network(resolve_ref(rf, nads, conf_dir, &label)?),
            None,
        )
    } else {
        let mut it = statics.into_iter();
        let first = it.next().ok_or(MetaError::NoDefaultNetwork)?;
        // In delegates mode the other delegates are attached to every pod, as in Multus.
        always.extend(it.map(|list| ResolvedNetwork {
            name: list.name.clone(),
            list,
            resource_name: None,
            nad: None,
        }));
        (
            ResolvedNetwork {
                name: first.name.clone(),
                list: first,
                resource_name: None,
                nad: None,
            },
            None,
        )
    };
    for rf in &r.always {
        always.push(operator_network(resolve_ref(rf, nads, conf_dir, &label)?));
    }
    let mut selected = Vec::new();
    for s in &r.selected {
        let ns = s.namespace_or(pod_ns);
        let rf = NetRef::Nad {
            ns: ns.into(),
            name: s.name.clone(),
            conf_fallback: false,
        };
        selected.push((s.clone(), resolve_ref(&rf, nads, conf_dir, &label)?));
    }
    plan::build(PlanInput {
        ifname,
        cni_args,
        runtime_config: &config.runtime_config,
        pod,
        default,
        always,
        selected,
        devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodIdentity;
    use serde_json::json;

    fn config(extra: serde_json::Value) -> PlexusConfig {
        let mut base = json!({"cniVersion":"1.0.0","name":"plexus","type":"plexus",
            "delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge"}]});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        PlexusConfig::parse(base.to_string().as_bytes()).unwrap()
    }

    fn pod(ns: &str, ann: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            id: PodIdentity {
                namespace: ns.into(),
                name: "p".into(),
                ..Default::default()
            },
            annotations: ann
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn nad(cfg: &str) -> Option<NadData> {
        Some(NadData {
            config: cfg.into(),
            ..Default::default()
        })
    }

    #[test]
    fn only_networks_a_pod_selected_by_nad_carry_the_nad_mark() {
        let c = config(
            json!({"clusterNetwork":"kube-system/flannel","defaultNetworks":["kube-system/mon"]}),
        );
        let nads: NadMap = [
            (
                ("kube-system".to_string(), "flannel".to_string()),
                nad(r#"{"cniVersion":"1.0.0","type":"bridge"}"#),
            ),
            (
                ("kube-system".to_string(), "mon".to_string()),
                nad(r#"{"cniVersion":"1.0.0","type":"macvlan"}"#),
            ),
            (
                ("db".to_string(), "mv".to_string()),
                nad(r#"{"cniVersion":"1.0.0","type":"macvlan"}"#),
            ),
        ]
        .into();
        let args = CniArgs::default();
        let p = pod("db", &[(NETWORKS_ANNOTATION, "mv")]);
        let r = requests(&c, Some(&p)).unwrap();
        let plan = make_plan(&c, "eth0", &args, Some(&p), &r, &nads, None).unwrap();
        let marks: Vec<Option<&str>> = plan
            .iter()
            .map(|a| a.nad.as_ref().map(|n| n.namespace.as_str()))
            .collect();
        // clusterNetwork and defaultNetworks are the operator's, even as NADs.
        assert_eq!(marks, vec![None, None, Some("db")]);
        assert!(plan[2].nad.as_ref().unwrap().inline_config);
        // The default-network override is the pod's choice.
        let p = pod("db", &[(DEFAULT_NETWORK_ANNOTATION, "db/mv")]);
        let r = requests(&c, Some(&p)).unwrap();
        let plan = make_plan(&c, "eth0", &args, Some(&p), &r, &nads, None).unwrap();
        assert_eq!(
            plan[0].nad.as_ref().map(|n| n.namespace.as_str()),
            Some("db")
        );
    }

    #[test]
    fn default_override_and_selections() {
        let c = config(json!({}));
        let p = pod(
            "db",
            &[
                (DEFAULT_NETWORK_ANNOTATION, "calico@eth0"),
                (NETWORKS_ANNOTATION, "mv,other/sr@data0"),
            ],
        );
        let r = requests(&c, Some(&p)).unwrap();
        let refs = nad_refs(&r, "db");
        assert_eq!(
            refs,
            vec![
                ("kube-system".into(), "calico".into()),
                ("db".into(), "mv".into()),
                ("other".into(), "sr".into())
            ]
        );
        let mut nads = NadMap::new();
        nads.insert(
            refs[0].clone(),
            nad(r#"{"cniVersion":"1.0.0","type":"ptp"}"#),
        );
        nads.insert(
            refs[1].clone(),
            nad(r#"{"cniVersion":"1.0.0","type":"macvlan"}"#),
        );
        nads.insert(refs[2].clone(), None);
        let args = CniArgs::default();
        let e = make_plan(&c, "eth0", &args, Some(&p), &r, &nads, None).unwrap_err();
        assert!(
            matches!(&e, MetaError::NadNotFound { pod, ns, name }
                if pod == "pod db/p" && ns == "other" && name == "sr"),
            "{e:?}"
        );
        assert_eq!(e.code(), 7);
        // An invalid NAD config names the NAD.
        nads.insert(refs[2].clone(), nad(r#"{"cniVersion":"1.0.0"}"#));
        let e = make_plan(&c, "eth0", &args, Some(&p), &r, &nads, None).unwrap_err();
        assert!(
            matches!(&e, MetaError::NadInvalid { ns, name, .. } if ns == "other" && name == "sr"),
            "{e:?}"
        );
        nads.insert(
            refs[2].clone(),
            nad(r#"{"cniVersion":"1.0.0","type":"sriov"}"#),
        );
        let plan = make_plan(&c, "eth0", &args, Some(&p), &r, &nads, None).unwrap();
        let v: Vec<(&str, &str)> = plan
            .iter()
            .map(|a| (a.network.as_str(), a.ifname.as_str()))
            .collect();
        assert_eq!(
            v,
            vec![
                ("kube-system/calico", "eth0"),
                ("db/mv", "net1"),
                ("other/sr", "data0")
            ]
        );
    }

    #[test]
    fn default_networks_skip_system_namespaces() {
        let c = config(json!({"defaultNetworks":["mon"]}));
        assert_eq!(requests(&c, Some(&pod("db", &[]))).unwrap().always.len(), 1);
        assert!(requests(&c, Some(&pod("kube-system", &[])))
            .unwrap()
            .always
            .is_empty());
    }

    #[test]
    fn an_uninstalling_node_gives_the_cluster_network_alone() {
        let ann = [
            (NETWORKS_ANNOTATION, "db/mv, db/sriov@net9"),
            (DEFAULT_NETWORK_ANNOTATION, "db/other"),
        ];
        let c = config(json!({"clusterNetwork":"kube-system/flannel","defaultNetworks":["mon"]}));
        let r = requests(&c, Some(&pod("db", &ann))).unwrap();
        assert_eq!((r.selected.len(), r.always.len()), (2, 1));
        assert!(r.default_override.is_some());
        let c = config(
            json!({"clusterNetwork":"kube-system/flannel","defaultNetworks":["mon"],
            "uninstalling":true}),
        );
        let r = requests(&c, Some(&pod("db", &ann))).unwrap();
        assert!(r.selected.is_empty() && r.always.is_empty() && r.default_override.is_none());
        assert!(r.cluster.is_some());
    }

    #[test]
    fn isolation_is_enforced() {
        let c = config(json!({"namespaceIsolation":true}));
        let e = requests(
            &c,
            Some(&pod("db", &[(DEFAULT_NETWORK_ANNOTATION, "other/x")])),
        )
        .unwrap_err();
        assert!(
            matches!(&e, MetaError::Isolation { ns, name, .. } if ns == "other" && name == "x"),
            "{e:?}"
        );
        assert!(requests(
            &c,
            Some(&pod("db", &[(DEFAULT_NETWORK_ANNOTATION, "calico")]))
        )
        .is_ok());
        let e = requests(&c, Some(&pod("db", &[(NETWORKS_ANNOTATION, "other/x")]))).unwrap_err();
        assert!(matches!(e, MetaError::Isolation { .. }), "{e:?}");
        assert!(requests(
            &c,
            Some(&pod("db", &[(NETWORKS_ANNOTATION, "default/x,y")]))
        )
        .is_ok());
    }

    #[test]
    fn static_delegates_become_net1_net2() {
        let c = config(
            json!({"delegates":[{"cniVersion":"1.0.0","name":"a","type":"bridge"},{"cniVersion":"1.0.0","name":"b","type":"macvlan"},{"cniVersion":"1.0.0","name":"c","type":"ptp"}]}),
        );
        let r = requests(&c, None).unwrap();
        let plan = make_plan(
            &c,
            "eth0",
            &CniArgs::default(),
            None,
            &r,
            &NadMap::new(),
            None,
        )
        .unwrap();
        let v: Vec<&str> = plan.iter().map(|a| a.ifname.as_str()).collect();
        assert_eq!(v, vec!["eth0", "net1", "net2"]);
    }

    #[test]
    fn malformed_annotation_names_pod() {
        let c = config(json!({}));
        let e = requests(&c, Some(&pod("db", &[(NETWORKS_ANNOTATION, "[{bad")]))).unwrap_err();
        assert!(
            matches!(&e, MetaError::Annotation { pod, .. } if pod == "db/p"),
            "{e:?}"
        );
        assert!(
            e.msg().contains("pod db/p") && e.msg().contains(NETWORKS_ANNOTATION),
            "{e}"
        );
        // The default-network annotation names exactly one network.
        let e = requests(&c, Some(&pod("db", &[(DEFAULT_NETWORK_ANNOTATION, "a,b")]))).unwrap_err();
        assert!(matches!(e, MetaError::Annotation { .. }), "{e:?}");
        assert_eq!(e.code(), 7);
    }

    #[test]
    fn missing_networks_are_told_apart() {
        let t = tempfile::tempdir().unwrap();
        // A clusterNetwork name that is neither a NAD nor a config in confDir.
        let c = config(json!({"clusterNetwork":"calico","confDir":t.path()}));
        let r = requests(&c, None).unwrap();
        let args = CniArgs::default();
        let e = make_plan(&c, "eth0", &args, None, &r, &NadMap::new(), None).unwrap_err();
        assert!(
            matches!(&e, MetaError::NetworkNotFound { name, .. } if name == "calico"),
            "{e:?}"
        );
        // No delegates and no clusterNetwork: no default network.
        let mut c = config(json!({}));
        c.delegates.clear();
        let r = requests(&c, None).unwrap();
        let e = make_plan(&c, "eth0", &args, None, &r, &NadMap::new(), None).unwrap_err();
        assert!(matches!(e, MetaError::NoDefaultNetwork), "{e:?}");
    }
}
