//! `plexus explain`: offline, from a pod manifest, NAD manifests and a plexus config, print the
//! attachment plan ADD would run (interface, network, exact delegate config) or the exact CNI
//! error ADD would return. Manifests are JSON (`kubectl get -o json`); a `List` is accepted.

use crate::context::Ctx;
use crate::error::MetaError;
use crate::inputs::files::{meta_str, FileInputs};
use crate::inputs::{self, Inputs};
use crate::plan::requests::NadMap;
use crate::plan::resolve::NadData;
use crate::pod::{PodIdentity, PodInfo};
use plexus_conf::args::CniArgs;
use plexus_conf::error::CniError;
use plexus_conf::plexus_config::PlexusConfig;
use plexus_conf::version;
use serde_json::{json, Value};

pub use crate::inputs::files::DeviceInputs;

pub mod live;
pub mod live_text;

const USAGE: &str = "usage: plexus explain --config FILE --pod FILE [--pod-name NAME] [--nad FILE]... [--ifname eth0]
                      [--device RESOURCE=ID]... [--claims FILE]... [--slices FILE]...
  Prints the attachment plan ADD would run for the pod, or the CNI error ADD would return.
  --pod may be a StatefulSet: the plan is its replica --pod-name (default: ordinal 0), with the
  fixed address its NADs' plexus.cni.io/fixed-ips mapping gives that replica.
  Files are JSON manifests (kubectl get -o json); a List of objects is accepted for --nad,
  --claims and --slices. --device gives a device-plugin allocation (the kubelet's); --claims
  and --slices give the DRA objects behind the pod's status.resourceClaimStatuses.
  Live on a node, from the API server and this node's state: plexus explain --pod NAMESPACE/NAME
  [--json] [--config FILE] (a --pod that is not a file and no --nad/--device/--claims/--slices).";

fn read_file(path: &str) -> Result<Vec<u8>, MetaError> {
    std::fs::read(path).map_err(|source| MetaError::ReadFile {
        path: path.to_string(),
        source,
    })
}

fn read_json(path: &str) -> Result<Value, MetaError> {
    serde_json::from_slice(&read_file(path)?).map_err(|source| MetaError::JsonFile {
        path: path.to_string(),
        source,
    })
}

fn objects(v: Value) -> Vec<Value> {
    match v.get("items").and_then(Value::as_array) {
        Some(items) => items.clone(),
        None => vec![v],
    }
}

/// The StatefulSet of a pod manifest: its controller `ownerReference` of kind `StatefulSet`.
fn statefulset_owner(pod: &Value) -> Option<String> {
    pod.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o["controller"] == json!(true) && o["kind"] == "StatefulSet")
        .and_then(|o| o["name"].as_str())
        .map(str::to_string)
}

/// The pod manifest `explain` plans for: a Pod as given, or replica `pod_name` (default: the
/// first) of a StatefulSet manifest — its template, named and owned like the controller does.
pub fn pod_manifest(manifest: Value, pod_name: Option<&str>) -> Value {
    let mut pod = if manifest["kind"] == "StatefulSet" {
        let set = manifest
            .pointer("/metadata/name")
            .cloned()
            .unwrap_or(json!(""));
        let template = manifest
            .pointer("/spec/template")
            .cloned()
            .unwrap_or(json!({}));
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("{}-0", set.as_str().unwrap_or("")),
                "namespace": manifest.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null),
                "annotations": template.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set,
                                     "uid": "", "controller": true}],
            },
            "spec": template.get("spec").cloned().unwrap_or(json!({})),
        })
    } else {
        manifest
    };
    if let (Some(name), Some(meta)) = (pod_name, pod.get_mut("metadata")) {
        meta["name"] = json!(name);
    }
    pod
}

/// Compute the plan as JSON, or the error ADD would return.
pub fn explain(
    config: &[u8],
    pod: &Value,
    nads: &[Value],
    ifname: &str,
    devices: &DeviceInputs,
) -> Result<Value, MetaError> {
    let cfg = PlexusConfig::parse(config).map_err(|source| MetaError::Config {
        source: source.into(),
    })?;
    let ns = {
        let n = meta_str(pod, "namespace");
        if n.is_empty() {
            "default".to_string()
        } else {
            n
        }
    };
    let info = PodInfo {
        id: PodIdentity {
            namespace: ns.clone(),
            name: meta_str(pod, "name"),
            uid: meta_str(pod, "uid"),
            ..Default::default()
        },
        annotations: pod
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(|a| serde_json::from_value(a.clone()).ok())
            .unwrap_or_default(),
        claims: crate::k8s::pod_from_json(pod.clone())
            .ok()
            .map(|p| crate::pod::PodClaims::from_pod(&p)),
        statefulset: statefulset_owner(pod),
    };
    let mut map = NadMap::new();
    for n in nads {
        let nns = {
            let x = meta_str(n, "namespace");
            if x.is_empty() {
                "default".to_string()
            } else {
                x
            }
        };
        let config = n
            .get("spec")
            .and_then(|s| s.get("config"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let resource_name = n
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(|a| a.get(plexus_conf::k8s::selection::RESOURCE_NAME_ANNOTATION))
            .and_then(Value::as_str)
            .map(str::to_string);
        let fixed_ips = n
            .get("metadata")
            .and_then(|m| m.get("annotations"))
            .and_then(|a| a.get(plexus_conf::k8s::fixed_ips::FIXED_IPS_ANNOTATION))
            .and_then(Value::as_str)
            .map(str::to_string);
        map.insert(
            (nns, meta_str(n, "name")),
            Some(NadData {
                config,
                resource_name,
                fixed_ips,
            }),
        );
    }
    let args = CniArgs::parse(&format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={}",
        info.id.namespace, info.id.name
    ))
    .map_err(|source| MetaError::CniArgs {
        source: source.into(),
    })?;
    let label = format!("pod {}", info.id.key());
    let id = info.id.clone();
    let mut files = FileInputs {
        pod: Some(info),
        nads: map,
        devices: devices.clone(),
    };
    let mut ctx = Ctx::from_config(cfg, &[], None);
    // The same stages as ADD: read (here from the manifests) → plan.
    let pod = files.pod(&mut ctx, &id)?;
    let read = inputs::read(&mut ctx, &mut files, pod, &label)?;
    let plan = crate::plan::for_pod(&ctx.config, ifname, &args, "<containerID>", &read)?;
    // What ADD would refuse on this node, refused here too.
    crate::nad_guard::check(&ctx.config.nad_policy, Some(&id.namespace), &label, &plan)?;
    Ok(plan_json(&ctx.config, &id.key(), &plan))
}

/// The JSON `plexus explain` prints for `plan` of pod `pod`: each attachment with the exact
/// delegate configs ADD runs.
pub fn plan_json(cfg: &PlexusConfig, pod: &str, plan: &[crate::plan::PlannedAttachment]) -> Value {
    let rt_path: Vec<String> = vec![cfg.bin_dir.clone()];
    json!({
        "pod": pod,
        "binDir": rt_path,
        "attachments": plan.iter().map(|a| {
            let list = a.list().ok();
            json!({
                "interface": a.ifname,
                "network": a.network,
                "default": a.is_default,
                "cniArgs": a.cni_args,
                "capabilityArgs": a.capability_args,
                "defaultRoute": a.default_route,
                "dropDefaultRoutes": {"ipv4": a.filter_v4, "ipv6": a.filter_v6},
                "resourceName": a.resource_name,
                "draDevice": a.dra,
                "delegates": list.map(|l| (0..l.plugins.len()).map(|i| {
                    l.plugin_request(i, if l.cni_version.is_empty() { "0.1.0" } else { &l.cni_version }, &a.capability_args, None)
                }).collect::<Vec<_>>()).unwrap_or_default(),
            })
        }).collect::<Vec<_>>(),
    })
}

/// CLI entry; returns the exit code.
pub fn main(argv: &[String]) -> i32 {
    let mut config = None;
    let mut pod = None;
    let mut pod_name = None;
    let mut nads = Vec::new();
    let mut ifname = "eth0".to_string();
    let mut devices = DeviceInputs::default();
    let mut claim_files = Vec::new();
    let mut slice_files = Vec::new();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned();
        match a.as_str() {
            "--config" => config = val(),
            "--pod" => pod = val(),
            "--pod-name" => pod_name = val(),
            "--nad" => nads.extend(val()),
            "--ifname" => ifname = val().unwrap_or(ifname),
            "--claims" => claim_files.extend(val()),
            "--slices" => slice_files.extend(val()),
            "--device" => match val().as_deref().and_then(|d| d.split_once('=')) {
                Some((res, id)) if !res.is_empty() && !id.is_empty() => {
                    devices.allocated.push((res.to_string(), id.to_string()))
                }
                _ => {
                    eprintln!("--device wants RESOURCE=ID\n{USAGE}");
                    return 2;
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return 0;
            }
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                return 2;
            }
        }
    }
    let (Some(config), Some(pod)) = (config, pod) else {
        eprintln!("{USAGE}");
        return 2;
    };
    let mut run = || -> Result<Value, MetaError> {
        let cfg = read_file(&config)?;
        let pod = pod_manifest(read_json(&pod)?, pod_name.as_deref());
        let mut all = Vec::new();
        for n in &nads {
            all.extend(objects(read_json(n)?));
        }
        for f in &claim_files {
            devices.claims.extend(objects(read_json(f)?));
        }
        for f in &slice_files {
            devices.slices.extend(objects(read_json(f)?));
        }
        explain(&cfg, &pod, &all, &ifname, &devices)
    };
    match run() {
        Ok(v) => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            0
        }
        Err(e) => {
            // The edge: the typed error becomes the CNI error ADD would print.
            println!(
                "{}",
                CniError::from(e).with_version(version::CURRENT).to_json()
            );
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_plan_and_errors() {
        let cfg = br#"{"cniVersion":"1.0.0","name":"plexus","type":"plexus","delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":"cni0"}]}"#;
        let pod = json!({"metadata":{"name":"pg-0","namespace":"db","annotations":{"k8s.v1.cni.cncf.io/networks":"[{\"name\":\"mv\",\"ips\":[\"10.1.1.5/24\"]}]"}}});
        let nad = json!({"kind":"List","items":[{"metadata":{"name":"mv","namespace":"db"},"spec":{"config":"{\"cniVersion\":\"1.0.0\",\"type\":\"macvlan\",\"ipam\":{\"type\":\"static\"}}"}}]});
        let v = explain(cfg, &pod, &objects(nad), "eth0", &DeviceInputs::default()).unwrap();
        assert_eq!(v["attachments"][1]["interface"], "net1");
        assert_eq!(v["attachments"][1]["network"], "db/mv");
        assert_eq!(v["attachments"][1]["delegates"][0]["name"], "mv");
        assert_eq!(v["attachments"][1]["delegates"][0]["type"], "macvlan");
        assert!(v["attachments"][1]["cniArgs"]
            .as_str()
            .unwrap()
            .contains("IP=10.1.1.5/24"));
        let e = explain(cfg, &pod, &[], "eth0", &DeviceInputs::default()).unwrap_err();
        assert!(
            matches!(&e, MetaError::NadNotFound { pod, ns, name } if pod == "pod db/pg-0" && ns == "db" && name == "mv"),
            "{e:?}"
        );
        // What `plexus explain` prints: the CNI error ADD would return.
        let c = CniError::from(e);
        assert_eq!(c.code, 7);
        assert_eq!(
            c.msg,
            "pod db/pg-0, network db/mv: NetworkAttachmentDefinition not found"
        );
        // An invalid config is reported as ADD would.
        let e = explain(b"{", &pod, &[], "eth0", &DeviceInputs::default()).unwrap_err();
        assert!(matches!(e, MetaError::Config { .. }), "{e:?}");
        assert_eq!(e.code(), 6);
    }

    #[test]
    fn explain_refuses_what_the_nad_policy_refuses_at_add() {
        let cfg = br#"{"cniVersion":"1.0.0","name":"plexus","type":"plexus","delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":"cni0"}]}"#;
        let pod = json!({"metadata":{"name":"pg-0","namespace":"db","annotations":{"k8s.v1.cni.cncf.io/networks":"mv"}}});
        let nad = json!({"metadata":{"name":"mv","namespace":"db"},"spec":{"config":
            "{\"cniVersion\":\"1.0.0\",\"type\":\"macvlan\",\"master\":\"eth1\",\"ipam\":{\"type\":\"host-local\",\"dataDir\":\"/etc/ceo\"}}"}});
        let e = explain(cfg, &pod, &[nad], "eth0", &DeviceInputs::default()).unwrap_err();
        let c = CniError::from(e);
        assert_eq!(c.code, 7);
        assert!(
            c.msg.contains("network db/mv") && c.msg.contains("ipam.dataDir \"/etc/ceo\""),
            "{c}"
        );
    }

    #[test]
    fn explains_device_plugin_and_dra_allocations() {
        let cfg = br#"{"cniVersion":"1.0.0","name":"plexus","type":"plexus","delegates":[{"cniVersion":"1.0.0","name":"cbr0","type":"bridge","bridge":"cni0"}]}"#;
        let nad = |name: &str, res: &str| {
            json!({"metadata":{"name":name,"namespace":"bank","annotations":{"k8s.v1.cni.cncf.io/resourceName":res}},
                   "spec":{"config":"{\"cniVersion\":\"1.0.0\",\"type\":\"sriov\"}"}})
        };
        let nads = vec![
            nad("vf-a", "intel.com/sriov_a"),
            nad("vf-b", "intel.com/sriov_b"),
        ];
        let pod = json!({"metadata":{"name":"pg-0","namespace":"bank","annotations":{"k8s.v1.cni.cncf.io/networks":"vf-a,vf-b"}},
            "spec":{"nodeName":"node-a","containers":[]},
            "status":{"resourceClaimStatuses":[{"name":"vfs","resourceClaimName":"pg-vfs"}]}});
        let claim = json!({"metadata":{"name":"pg-vfs","namespace":"bank"},"spec":{},
            "status":{"allocation":{"devices":{"results":[{"request":"vfs","driver":"d","pool":"node-a","device":"vf-7"}]}}}});
        let slice = json!({"metadata":{"name":"s"},"spec":{"driver":"d","nodeName":"node-a",
            "pool":{"name":"node-a","generation":1,"resourceSliceCount":1},
            "devices":[{"name":"vf-7","attributes":{"k8s.cni.cncf.io/deviceID":{"string":"0000:af:06.7"},
                                                     "k8s.cni.cncf.io/resourceName":{"string":"intel.com/sriov_b"}}}]}});
        let inputs = DeviceInputs {
            allocated: vec![("intel.com/sriov_a".into(), "0000:af:06.0".into())],
            claims: vec![claim],
            slices: vec![slice],
        };
        let v = explain(cfg, &pod, &nads, "eth0", &inputs).unwrap();
        let a = &v["attachments"];
        assert_eq!(a[1]["delegates"][0]["deviceID"], "0000:af:06.0");
        assert!(a[1]["draDevice"].is_null());
        assert_eq!(a[2]["delegates"][0]["deviceID"], "0000:af:06.7");
        assert_eq!(a[2]["draDevice"]["claimName"], "pg-vfs");
        assert_eq!(a[2]["draDevice"]["device"], "vf-7");
        assert!(a[2]["capabilityArgs"]["CNIDeviceInfoFile"]
            .as_str()
            .unwrap()
            .ends_with("bank-vf-b-<containerID>_net2"));
        // Without the claim's objects the B network has no device: the exact ADD error.
        let only_dp = DeviceInputs {
            allocated: inputs.allocated.clone(),
            ..Default::default()
        };
        let e = explain(cfg, &pod, &nads, "eth0", &only_dp).unwrap_err();
        assert!(
            matches!(&e, MetaError::NoDeviceLeft { network, resource, allocated: 0, .. }
                if network == "bank/vf-b" && resource == "intel.com/sriov_b"),
            "{e:?}"
        );
        // A claim manifest that is not a ResourceClaim.
        let bad = DeviceInputs {
            claims: vec![json!({"metadata":{"name":"pg-vfs"},"spec":{"devices":7}})],
            ..Default::default()
        };
        let e = explain(cfg, &pod, &nads, "eth0", &bad).unwrap_err();
        assert!(
            matches!(
                e,
                MetaError::Manifest {
                    what: "a claim",
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
