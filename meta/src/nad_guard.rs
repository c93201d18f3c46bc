//! The node's NAD policy applied to a plan (`nadPolicy`, docs/security.md): before any
//! delegate runs, every network a pod selected by NAD is checked — the host paths its config
//! names must resolve (symlinks followed, as the plugin would) under the operator's directories,
//! and the host interfaces, VLANs, resources and devices it names must be given to the pod's
//! namespace and to the NAD's. What a config names is `plexus_conf::nad_policy`'s business; this
//! module adds the filesystem and the modes.

use crate::error::{MetaError, NadRefusal};
use crate::plan::PlannedAttachment;
use plexus_conf::nad_policy::{
    host, paths, Allowances, HostKind, Mode, NadPolicy, PathClass, PathPolicy,
};
use plexus_delegates::hostroot;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// One thing a NAD names that the policy does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Which part of the policy: paths or host resources.
    pub mode: Mode,
    /// Where in the config.
    pub location: String,
    /// The value.
    pub value: String,
    /// Why.
    pub why: String,
    /// What is allowed instead.
    pub allowed: String,
    /// The metrics' class ([`crate::outcome::refusal_class`]): `path_logs`, `host_vlans`, …
    pub class: String,
}

/// Check `plan` for the pod in `pod_ns` (`None`: no pod, static delegates: nothing to check).
/// Audit-mode findings are logged; the first enforce-mode one is the error.
pub fn check(
    policy: &NadPolicy,
    pod_ns: Option<&str>,
    label: &str,
    plan: &[PlannedAttachment],
) -> Result<(), MetaError> {
    for a in plan {
        if let Some(r) = enforced(policy, pod_ns, a).into_iter().next() {
            crate::outcome::sink().policy_refusal(&r.class);
            return Err(MetaError::NadPolicy {
                pod: label.to_string(),
                network: a.network.clone(),
                refusal: Box::new(NadRefusal {
                    location: r.location,
                    value: r.value,
                    why: r.why,
                    allowed: r.allowed,
                }),
            });
        }
    }
    Ok(())
}

/// The refusals of `a` that the policy enforces; audit-mode ones are logged here.
pub fn enforced(policy: &NadPolicy, pod_ns: Option<&str>, a: &PlannedAttachment) -> Vec<Refusal> {
    let (enforce, audit): (Vec<Refusal>, Vec<Refusal>) = refusals(policy, pod_ns, a)
        .into_iter()
        .filter(|r| r.mode != Mode::Off)
        .partition(|r| r.mode == Mode::Enforce);
    for r in audit {
        tracing::warn!(network = %a.network, location = %r.location, value = %r.value,
            why = %r.why, allowed = %r.allowed,
            "NAD policy (audit mode): this NAD would be refused in enforce mode");
    }
    enforce
}

/// Everything `a` names that the policy does not allow, each with its part's mode.
pub fn refusals(policy: &NadPolicy, pod_ns: Option<&str>, a: &PlannedAttachment) -> Vec<Refusal> {
    let (Some(nad), Some(pod_ns)) = (&a.nad, pod_ns) else {
        return Vec::new();
    };
    let trusted = policy.trusted_namespaces.contains(&nad.namespace);
    let mut out = Vec::new();
    if policy.paths.mode != Mode::Off {
        if nad.inline_config && !trusted {
            out.extend(path_refusals(&policy.paths, &a.config));
        } else {
            // The operator's config, but the pod's `cni-args` went into each plugin's
            // `args.cni`: those are still a namespace user's.
            out.extend(path_refusals(&policy.paths, &plugin_args(&a.config)));
        }
    }
    if policy.host_resources.mode != Mode::Off {
        // Validated at config parse; a failure here means nothing is allowed.
        let allow = Allowances::parse(&policy.host_resources.allow).unwrap_or_default();
        let mut namespaces = vec![pod_ns];
        if nad.inline_config && !trusted && nad.namespace != pod_ns {
            namespaces.push(nad.namespace.as_str());
        }
        out.extend(
            host_refusals(&allow, &namespaces, a)
                .into_iter()
                .map(|mut r| {
                    r.mode = policy.host_resources.mode;
                    r
                }),
        );
    }
    out
}

/// Each plugin's `args`, where the pod's `cni-args` are injected, as one object
/// (`plugins[0].args` …) for [`path_refusals`].
fn plugin_args(config: &serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (at, p) in plexus_conf::nad_policy::plugins(config) {
        if let Some(args) = p.get("args") {
            let key = if at.is_empty() {
                "args".to_string()
            } else {
                format!("{at}.args")
            };
            out.insert(key, args.clone());
        }
    }
    serde_json::Value::Object(out)
}

/// The path-valued keys of `config` that do not resolve under their class's directories.
fn path_refusals(policy: &PathPolicy, config: &serde_json::Value) -> Vec<Refusal> {
    paths::find(config, &policy.keys)
        .into_iter()
        .filter_map(|pv| {
            let dirs = policy.dirs(pv.class);
            let allowed = format!("{dirs:?} ({})", PathPolicy::field(pv.class));
            let why = path_problem(&pv.value, pv.class, &dirs)?;
            Some(Refusal {
                mode: policy.mode,
                location: pv.location,
                value: pv.value,
                why,
                allowed,
                class: crate::outcome::refusal_class("path", pv.class.name()),
            })
        })
        .collect()
}

/// Why `value` (a path of `class`) is refused, or `None` when it resolves under one of `dirs`.
fn path_problem(value: &str, class: PathClass, dirs: &[&str]) -> Option<String> {
    if let Some(why) = paths::lexical_problem(value) {
        return Some(why.to_string());
    }
    let resolved = match resolve(Path::new(value)) {
        Ok(p) => p,
        Err(why) => return Some(why),
    };
    let usable: Vec<PathBuf> = dirs.iter().filter_map(|d| usable_dir(d)).collect();
    if usable.iter().any(|d| paths::is_under(&resolved, d)) {
        return None;
    }
    let shown = if resolved == Path::new(value) {
        String::new()
    } else {
        format!(" (it resolves to {})", resolved.display())
    };
    Some(format!(
        "a {} path must be under a directory the node operator allows{shown}",
        class.name()
    ))
}

/// An allowed directory as the kernel resolves it; `None` (skipped, with a warning) when it is
/// writable by every user, where anyone could plant a symlink.
fn usable_dir(d: &str) -> Option<PathBuf> {
    let resolved = resolve(Path::new(d)).ok()?;
    match std::fs::metadata(hostroot::host_path(&resolved)) {
        Ok(m) if m.permissions().mode() & 0o002 != 0 => {
            tracing::warn!(dir = %d, "nadPolicy.paths directory is writable by every user: not used");
            None
        }
        _ => Some(resolved),
    }
}

/// Most symlinks followed in one path (the kernel's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Host path `path` as a plugin opening it would reach it: every symlink of its existing part
/// followed (within the host root in daemon mode, where delegates run chrooted into it), a
/// dangling one to where its target would be created, the missing part appended.
fn resolve(path: &Path) -> Result<PathBuf, String> {
    resolve_in(hostroot::get().unwrap_or(Path::new("/")), path)
}

/// [`resolve`] within `root`: `path` and symlink targets are paths of the tree under `root`.
fn resolve_in(root: &Path, path: &Path) -> Result<PathBuf, String> {
    let mut done = PathBuf::from("/");
    let mut todo: VecDeque<OsString> = parts(path);
    let mut links = 0;
    let mut exists = true;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            done.pop();
            continue;
        }
        let next = done.join(&c);
        if !exists {
            done = next;
            continue;
        }
        let seen = root.join(next.strip_prefix("/").unwrap_or(&next));
        match std::fs::symlink_metadata(&seen) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(format!(
                        "{} has too many levels of symlinks",
                        path.display()
                    ));
                }
                let target = std::fs::read_link(&seen)
                    .map_err(|e| format!("{} cannot be read: {e}", next.display()))?;
                if target.is_absolute() {
                    done = PathBuf::from("/");
                }
                let mut rest = parts(&target);
                rest.extend(todo);
                todo = rest;
            }
            Ok(_) => done = next,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                exists = false;
                done = next;
            }
            Err(e) => return Err(format!("{} cannot be looked at: {e}", next.display())),
        }
    }
    Ok(done)
}

/// The named components of `p` (`.` dropped, `..` kept), for [`resolve_in`].
fn parts(p: &Path) -> VecDeque<OsString> {
    p.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// What `a` names on the host that one of `namespaces` is not given.
fn host_refusals(allow: &Allowances, namespaces: &[&str], a: &PlannedAttachment) -> Vec<Refusal> {
    let nad = a.nad.as_ref();
    // Devices the kubelet allocated for the NAD's resource went into the config: the resource
    // name is what the NAD chose.
    let allocated = a.resource_name.is_some();
    let mut uses = host::find(&a.config, allocated);
    if let Some(res) = nad.and_then(|n| n.resource_name.as_ref()) {
        uses.push(host::HostUse {
            location: "resourceName (NAD annotation k8s.v1.cni.cncf.io/resourceName)".into(),
            kind: HostKind::Resource,
            value: res.clone(),
        });
    }
    // A device the pod asked for (runtimeConfig.deviceID through the NAD's capability).
    if !allocated {
        if let Some(d) = a.capability_args.get("deviceID").and_then(|v| v.as_str()) {
            uses.push(host::HostUse {
                location: "runtimeConfig.deviceID (the pod's request)".into(),
                kind: HostKind::Device,
                value: d.to_string(),
            });
        }
    }
    let mut out = Vec::new();
    for u in uses {
        let Some(ns) = namespaces
            .iter()
            .find(|ns| !allow.allows(ns, u.kind, &u.value))
        else {
            continue;
        };
        let what = match (u.kind, u.value.is_empty()) {
            (HostKind::Interface, true) => {
                "the node's default-route interface (no master named)".to_string()
            }
            (HostKind::Interface, false) => format!("host interface {}", u.value),
            (HostKind::Vlan, _) => format!("VLAN {}", u.value),
            (HostKind::Resource, _) => format!("resource {}", u.value),
            (HostKind::Device, _) => format!("device {}", u.value),
        };
        let kind = u.kind.key();
        out.push(Refusal {
            mode: Mode::Enforce,
            location: u.location,
            value: u.value,
            why: format!("namespace {ns} is not given {what}"),
            allowed: format!(
                "{:?} (nadPolicy.hostResources.allow {ns}.{kind} and {}.{kind})",
                allow.entries(ns, u.kind),
                host::ALL_NAMESPACES
            ),
            class: crate::outcome::refusal_class("host", kind),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::SelectedNad;
    use serde_json::{json, Value};

    fn attachment(ns: &str, inline: bool, config: Value) -> PlannedAttachment {
        PlannedAttachment {
            nad: Some(SelectedNad {
                namespace: ns.into(),
                inline_config: inline,
                resource_name: None,
            }),
            ..PlannedAttachment::for_test(&format!("{ns}/n"), config)
        }
    }

    fn policy(v: Value) -> NadPolicy {
        let p: NadPolicy = serde_json::from_value(v).unwrap();
        p.validate().unwrap();
        p
    }

    fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("plexus-nad-guard-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn paths_outside_and_through_symlinks_are_refused() {
        let root = tmp("paths");
        let allowed = root.join("allowed");
        std::fs::create_dir(&allowed).unwrap();
        std::os::unix::fs::symlink("/etc", allowed.join("escape")).unwrap();
        std::os::unix::fs::symlink(root.join("nowhere"), allowed.join("dangling")).unwrap();
        let p = policy(json!({"paths":{"data":[allowed],"logs":[allowed]}}));
        let cfg = |dir: &str| json!({"type":"macvlan","master":"x","ipam":{"type":"host-local","dataDir":dir}});
        let ok = attachment("bank", true, cfg(&format!("{}/new/sub", allowed.display())));
        assert!(check(&p, Some("bank"), "pod bank/p", &[ok]).is_ok());
        for bad in [
            "/etc/ceo-nad-datadir".to_string(),
            format!("{}/escape/x", allowed.display()),
            format!("{}/dangling", allowed.display()),
            format!("{}/../outside", allowed.display()),
            "relative/dir".to_string(),
        ] {
            let a = attachment("bank", true, cfg(&bad));
            let e = check(&p, Some("bank"), "pod bank/p", &[a]).unwrap_err();
            let c = plexus_conf::error::CniError::from(e);
            assert_eq!(c.code, 7, "{bad}");
            assert!(
                c.msg.contains("pod bank/p")
                    && c.msg.contains("bank/n")
                    && c.msg.contains("ipam.dataDir")
                    && c.msg.contains(&format!("{bad:?}")),
                "{c}"
            );
            assert!(c.details.contains("nadPolicy.paths.data"), "{c}");
        }
        // The operator's own configs and trusted namespaces' NADs are not path-checked.
        let mut op = attachment("bank", true, cfg("/etc/x"));
        op.nad = None;
        assert!(check(&p, Some("bank"), "l", &[op]).is_ok());
        let sys = attachment("kube-system", true, cfg("/etc/x"));
        assert!(check(&p, Some("bank"), "l", &[sys]).is_ok());
        // A file-backed NAD (empty spec) is the operator's config too.
        let file = attachment("bank", false, cfg("/etc/x"));
        assert!(check(&p, Some("bank"), "l", &[file]).is_ok());
        // Audit mode logs and goes on.
        let audit = policy(json!({"paths":{"mode":"audit","data":[allowed]}}));
        assert!(check(
            &audit,
            Some("bank"),
            "l",
            &[attachment("bank", true, cfg("/etc/x"))]
        )
        .is_ok());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn symlinks_resolve_inside_the_host_root_as_a_chrooted_plugin_sees_them() {
        let root = tmp("root");
        std::fs::create_dir_all(root.join("var/lib/cni/networks")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        // Absolute targets are host paths: /etc inside the root, not this process' /etc.
        std::os::unix::fs::symlink("/etc", root.join("var/lib/cni/networks/abs")).unwrap();
        std::os::unix::fs::symlink("../../../../etc/x", root.join("var/lib/cni/networks/rel"))
            .unwrap();
        std::os::unix::fs::symlink(
            "/var/lib/cni/networks/new",
            root.join("var/lib/cni/networks/ok"),
        )
        .unwrap();
        let r = |p: &str| resolve_in(&root, Path::new(p)).unwrap();
        assert_eq!(
            r("/var/lib/cni/networks/abs/passwd"),
            Path::new("/etc/passwd")
        );
        assert_eq!(r("/var/lib/cni/networks/rel"), Path::new("/etc/x"));
        // A dangling link: where the plugin would create its target.
        assert_eq!(
            r("/var/lib/cni/networks/ok/leases"),
            Path::new("/var/lib/cni/networks/new/leases")
        );
        assert_eq!(
            r("/var/lib/cni/networks/a/b"),
            Path::new("/var/lib/cni/networks/a/b")
        );
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert!(resolve_in(&root, Path::new("/loop/x"))
            .unwrap_err()
            .contains("too many"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_pods_cni_args_are_checked_even_in_an_operators_config() {
        let p = policy(json!({}));
        let args = json!({"type":"macvlan","args":{"cni":{"dumpFile":"/etc/evil"}}});
        for (ns, inline) in [("kube-system", true), ("bank", false)] {
            let e = check(
                &p,
                Some("bank"),
                "l",
                &[attachment(ns, inline, args.clone())],
            )
            .unwrap_err();
            assert!(e.to_string().contains("args.cni.dumpFile"), "{e}");
        }
    }

    #[test]
    fn a_world_writable_allowed_dir_is_not_used() {
        let root = tmp("ww");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let p = policy(json!({"paths":{"data":[root]}}));
        let a = attachment("bank", true, json!({"type":"x","dataDir":root.join("d")}));
        assert!(check(&p, Some("bank"), "l", &[a]).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn host_resources_per_namespace() {
        let p = policy(json!({"hostResources":{"mode":"enforce","allow":{
            "bank.interfaces":"ens1f0","bank.vlans":"100","bank.resourceNames":"intel.com/bank_vf"}}}));
        let mv = |master: &str, vlan: u32| json!({"type":"vlan","master":master,"vlanId":vlan});
        assert!(check(
            &p,
            Some("bank"),
            "l",
            &[attachment("bank", true, mv("ens1f0", 100))]
        )
        .is_ok());
        let e = check(
            &p,
            Some("bank"),
            "pod bank/p",
            &[attachment("bank", true, mv("eth0", 100))],
        )
        .unwrap_err();
        let c = plexus_conf::error::CniError::from(e);
        assert!(
            c.msg.contains("master") && c.msg.contains("\"eth0\""),
            "{c}"
        );
        assert!(
            c.details
                .contains("namespace bank is not given host interface eth0")
                && c.details.contains("ens1f0"),
            "{c}"
        );
        assert!(check(
            &p,
            Some("bank"),
            "l",
            &[attachment("bank", true, mv("ens1f0", 101))]
        )
        .is_err());
        // Another namespace's pod may not use bank's interface, even through a bank NAD…
        assert!(check(
            &p,
            Some("dev"),
            "l",
            &[attachment("bank", true, mv("ens1f0", 100))]
        )
        .is_err());
        // …nor can a dev NAD hand it to a bank pod.
        assert!(check(
            &p,
            Some("bank"),
            "l",
            &[attachment("dev", true, mv("ens1f0", 100))]
        )
        .is_err());
        // Resources: the NAD's annotation; devices from the allocation are not the NAD's.
        let mut vf = attachment(
            "bank",
            true,
            json!({"type":"sriov","deviceID":"0000:af:06.1","vlan":100}),
        );
        vf.nad.as_mut().unwrap().resource_name = Some("intel.com/bank_vf".into());
        vf.resource_name = Some("intel.com/bank_vf".into());
        assert!(check(&p, Some("bank"), "l", std::slice::from_ref(&vf)).is_ok());
        vf.nad.as_mut().unwrap().resource_name = Some("intel.com/other".into());
        assert!(check(&p, Some("bank"), "l", std::slice::from_ref(&vf)).is_err());
        // A device the NAD (or the pod) names itself needs an allowance.
        let named = attachment(
            "bank",
            true,
            json!({"type":"host-device","pciBusID":"0000:04:00.1"}),
        );
        assert!(check(&p, Some("bank"), "l", &[named]).is_err());
        let mut asked = attachment(
            "bank",
            true,
            json!({"type":"host-device","capabilities":{"deviceID":true}}),
        );
        asked
            .capability_args
            .insert("deviceID".into(), json!("0000:04:00.1"));
        assert!(check(&p, Some("bank"), "l", &[asked]).is_err());
        // The default (audit) never refuses.
        let audit = policy(json!({}));
        assert!(check(
            &audit,
            Some("dev"),
            "l",
            &[attachment("dev", true, mv("eth0", 7))]
        )
        .is_ok());
        // No pod (static delegates): nothing selected by NAD.
        assert!(check(&p, None, "l", &[attachment("dev", true, mv("eth0", 7))]).is_ok());
    }
}
