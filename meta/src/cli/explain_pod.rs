//! `plexus explain --pod NAMESPACE/NAME [--json]`: the live form of `plexus explain`
//! ([`crate::verbs::explain::live`]), with the node's installed config
//! ([`super::node_config`]). The offline form (`--pod FILE` with `--nad FILE`…) is
//! [`crate::verbs::explain::main`]; a `--pod` value that names an existing file, or any
//! `--nad`/`--claims`/`--slices`/`--device`, selects it.

use super::node_config;
use crate::k8s::InClusterEnv;
use crate::verbs::explain::{live, live_text};

const USAGE: &str =
    "usage: plexus explain --pod NAMESPACE/NAME [--json] [--config FILE] [--ifname eth0]
  Reads the pod and its NetworkAttachmentDefinitions from the API server with this node's
  plexus config (its kubeconfig, else the in-cluster service account) and runs ADD's stages
  without running any delegate: prints the plan ADD would run, or the CNI error it returns and
  why (NAD missing, refused by the node's NAD policy and its class, device not allocated,
  address held by another pod...), with this node's saved plan for the pod and its
  network-status. Writes nothing. --config defaults to /etc/cni/net.d/00-plexus.conflist
  (or .conf); --cni-path (default: CNI_PATH) is the runtime's plugin directory, searched after
  the config's binDir. Exit code: 0 ADD would succeed, 1 it fails, 2 usage or config errors.";

/// The live form is wanted: `--pod` names `NAMESPACE/NAME` that is not a file, and no
/// offline-only flag is given.
pub fn wanted(argv: &[String]) -> bool {
    let offline = ["--nad", "--claims", "--slices", "--device", "--pod-name"];
    if argv.iter().any(|a| offline.contains(&a.as_str())) {
        return false;
    }
    let Some(i) = argv.iter().position(|a| a == "--pod") else {
        return false;
    };
    argv.get(i + 1)
        .is_some_and(|p| pod_ref(p).is_some() && !std::path::Path::new(p).exists())
}

fn pod_ref(s: &str) -> Option<(&str, &str)> {
    let (ns, name) = s.split_once('/')?;
    let ok = |x: &str| crate::k8s::names::name_problem(x).is_none() && !x.contains('/');
    (ok(name) && crate::k8s::names::namespace_problem(ns).is_none()).then_some((ns, name))
}

/// CLI entry; returns the exit code.
pub fn main(argv: &[String]) -> i32 {
    let mut json = false;
    let mut config = None;
    let mut pod = None;
    let mut ifname = "eth0".to_string();
    let mut cni_path: Option<String> = std::env::var("CNI_PATH").ok();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned();
        match a.as_str() {
            "--json" => json = true,
            "--config" => config = val(),
            "--pod" => pod = val(),
            "--ifname" => ifname = val().unwrap_or(ifname),
            "--cni-path" => cni_path = val(),
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
    let Some((ns, name)) = pod.as_deref().and_then(pod_ref) else {
        eprintln!("{USAGE}");
        return 2;
    };
    let node = match node_config::load(config.as_deref()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("plexus explain: {e}");
            return 2;
        }
    };
    let req = live::Request {
        namespace: ns.to_string(),
        name: name.to_string(),
        ifname,
        cni_path: cni_path
            .iter()
            .flat_map(|p| p.split(':'))
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
            .collect(),
    };
    let ex = live::explain(
        node.config,
        node.path,
        &req,
        InClusterEnv::from_process_env(),
    );
    if json {
        println!("{}", serde_json::to_string_pretty(&ex).unwrap_or_default());
    } else {
        print!("{}", live_text::text(&ex));
    }
    i32::from(ex.verdict != "ok")
}
