//! `deploy/` as a kustomize base with components, rendered with the shared kubectl (kustomize is
//! built in; `PLEXUS_K8S_BIN`, plain or `.xz`) and no cluster: every overlay and every
//! combination of a mode with the optional components renders; plexus' namespace is one
//! everywhere it matters (namespaced objects, the ClusterRoleBindings' ServiceAccount subjects,
//! the admission policies' parameter references) and follows deploy/settings' `namespace:` (or a
//! `namespace:` set on top of an overlay); every container runs one image, `plexus:<workspace
//! version>`, which follows `images:`.
//!
//! The metrics component (components/metrics, + its podmonitor) with either mode: its RBAC and
//! PodMonitor in plexus' namespace, and the mode's metrics container patched onto the node's
//! address (`$(PLEXUS_NODE_IP):9109` from status.hostIP, a port named `metrics`, the daemon's
//! probes over HTTPS); without it, the daemon stays on 127.0.0.1.
//!
//! Skipped (and passing) without `PLEXUS_K8S_BIN`; `PLEXUS_K8S_REQUIRE=1` makes that a failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use plexus_e2e::realk8s::bins::{find_usable, required, skip_message, BIN_ENV};
use plexus_e2e::realk8s::deploy::{deploy_dir, Rendered, MODES, OPTIONAL_COMPONENTS};
use plexus_e2e::realk8s::node_rig::PLEXUS_NAMESPACE;
use serde_json::Value;

/// Kinds without a namespace (kustomize does not know the admission policies are cluster-scoped
/// and writes a namespace into them, which the API server ignores).
const CLUSTER_SCOPED: [&str; 5] = [
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// The shared kubectl, or `None` (skip) without `PLEXUS_K8S_BIN`.
fn kubectl() -> Option<PathBuf> {
    let dir = std::env::var_os(BIN_ENV).filter(|d| !d.is_empty());
    let found = dir.and_then(|d| find_usable(Path::new(&d), "kubectl").expect("unpack kubectl"));
    if found.is_none() {
        assert!(!required(), "{}", skip_message());
        println!("{}", skip_message());
    }
    found
}

/// The `[workspace.package]` version in the workspace's Cargo.toml.
fn workspace_version() -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
        .expect("Cargo.toml");
    let section = &text[text
        .find("[workspace.package]")
        .expect("[workspace.package]")..];
    let line = section
        .lines()
        .find(|l| l.trim_start().starts_with("version"))
        .expect("a version in [workspace.package]");
    line.split('"').nth(1).expect("quoted version").to_string()
}

/// A copy of deploy/ in a temp dir, where kustomizations of every combination can sit beside
/// the base (a kustomization may only name directories by relative path).
struct Copy {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Copy {
    fn new() -> Copy {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("deploy");
        copy_dir(&deploy_dir(), &root);
        Copy { _tmp: tmp, root }
    }

    /// A kustomization `combos/<name>` of the base, `components` (paths under deploy/) and the
    /// settings, last as the overlays list them.
    fn combo(&self, name: &str, components: &[String]) -> PathBuf {
        let dir = self.root.join("combos").join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut text = String::from(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../../base\ncomponents:\n",
        );
        for c in components.iter().map(String::as_str).chain(["settings"]) {
            text.push_str(&format!("  - ../../{c}\n"));
        }
        std::fs::write(dir.join("kustomization.yaml"), text).expect("write");
        dir
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let p = e.expect("entry").path();
        let dst = to.join(p.file_name().expect("name"));
        if p.is_dir() {
            copy_dir(&p, &dst);
        } else {
            std::fs::copy(&p, &dst).expect("copy");
        }
    }
}

/// Every place of `r` that names plexus' namespace, as (where, namespace): namespaced objects'
/// `metadata.namespace`, ClusterRoleBinding subjects that are plexus' ServiceAccount, admission
/// policy bindings' `paramRef.namespace`.
fn namespaces(r: &Rendered) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for o in &r.objects {
        let kind = o["kind"].as_str().unwrap_or("");
        let id = Rendered::id(o);
        if !CLUSTER_SCOPED.contains(&kind) {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or("(none)");
            v.push((id.clone(), ns.to_string()));
        }
        for s in o["subjects"].as_array().into_iter().flatten() {
            if s["kind"] == "ServiceAccount" && s["name"] == "plexus" {
                let ns = s["namespace"].as_str().unwrap_or("(none)");
                v.push((format!("{id} subject"), ns.to_string()));
            }
        }
        if let Some(ns) = o["spec"]["paramRef"]["namespace"].as_str() {
            v.push((format!("{id} paramRef"), ns.to_string()));
        }
    }
    v
}

/// The names (`Kind/name`) a component adds.
fn component_objects(component: &str) -> &'static [&'static str] {
    match component {
        "thin" => &["DaemonSet/kube-plexus-ds"],
        "daemon" => &[
            "DaemonSet/kube-plexus-daemon",
            "ClusterRole/plexus-daemon",
            "ClusterRoleBinding/plexus-daemon",
        ],
        "fixed-ips" => &[
            "CustomResourceDefinition/addressclaims.plexus.cni.io",
            "ClusterRole/plexus-fixed-ips",
            "ClusterRoleBinding/plexus-fixed-ips",
        ],
        "dra" => &["ClusterRole/plexus-dra", "ClusterRoleBinding/plexus-dra"],
        "nad-policy" => &[
            "ValidatingAdmissionPolicy/plexus-nad-policy",
            "ValidatingAdmissionPolicyBinding/plexus-nad-policy",
            "ConfigMap/plexus-nad-policy",
        ],
        "node-restriction" => &[
            "ValidatingAdmissionPolicy/plexus-node-restriction",
            "ValidatingAdmissionPolicyBinding/plexus-node-restriction",
        ],
        "metrics" => &[
            "ClusterRole/plexus-metrics-auth",
            "ClusterRoleBinding/plexus-metrics-auth",
            "ClusterRole/plexus-metrics-reader",
        ],
        "metrics/podmonitor" => &[
            "PodMonitor/plexus",
            "ServiceAccount/plexus-metrics-scraper",
            "Secret/plexus-metrics-scraper-token",
            "ClusterRoleBinding/plexus-metrics-scraper",
        ],
        other => panic!("unknown component {other}"),
    }
}

/// The base's objects.
const BASE: [&str; 4] = [
    "CustomResourceDefinition/network-attachment-definitions.k8s.cni.cncf.io",
    "ServiceAccount/plexus",
    "ClusterRole/plexus",
    "ClusterRoleBinding/plexus",
];

fn names(r: &Rendered) -> BTreeSet<String> {
    r.objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// Checks of one rendering: exactly `expected` objects, every namespace place `ns`, every image
/// `image`, and no other namespace or image in its text.
fn check(r: &Rendered, expected: &BTreeSet<String>, ns: &str, image: &str) {
    let what = r.dir.display();
    assert_eq!(&names(r), expected, "{what}: objects");
    let places = namespaces(r);
    assert!(!places.is_empty(), "{what}: no namespace");
    let wrong: Vec<_> = places.iter().filter(|(_, n)| n != ns).collect();
    assert!(wrong.is_empty(), "{what}: not in {ns}: {wrong:?}");
    let images = r.images();
    assert!(images.len() >= 2, "{what}: images {images:?}");
    let wrong: Vec<_> = images.iter().filter(|(_, i)| i != image).collect();
    assert!(wrong.is_empty(), "{what}: not {image}: {wrong:?}");
    if ns != "kube-system" {
        // kube-system stays only where it is the administrators' namespace, not plexus': the
        // NAD policy binding's namespaceSelector.
        for o in &r.objects {
            let text = serde_json::to_string(o).expect("json");
            if text.contains("kube-system") {
                let sel = &o["spec"]["matchResources"]["namespaceSelector"];
                let mut o2 = o.clone();
                o2["spec"]["matchResources"]["namespaceSelector"] = Value::Null;
                assert!(
                    !serde_json::to_string(&o2)
                        .expect("json")
                        .contains("kube-system"),
                    "{what}: {} names kube-system outside its namespaceSelector ({sel})",
                    Rendered::id(o)
                );
            }
        }
    }
}

/// Every subset of the optional components (as paths under deploy/).
fn subsets() -> Vec<Vec<&'static str>> {
    (0..1u32 << OPTIONAL_COMPONENTS.len())
        .map(|bits| {
            OPTIONAL_COMPONENTS
                .iter()
                .enumerate()
                .filter(|(i, _)| bits & (1 << i) != 0)
                .map(|(_, c)| *c)
                .collect()
        })
        .collect()
}

#[test]
fn every_overlay_and_component_combination_renders_with_one_namespace_and_one_image() {
    let Some(kubectl) = kubectl() else { return };
    let image = format!("plexus:{}", workspace_version());
    for mode in MODES {
        let r = Rendered::render(&kubectl, &deploy_dir().join("overlays").join(mode))
            .expect("render overlay");
        let mut expected: BTreeSet<String> = BASE.iter().map(|s| s.to_string()).collect();
        expected.extend(component_objects(mode).iter().map(|s| s.to_string()));
        check(&r, &expected, PLEXUS_NAMESPACE, &image);
        assert_eq!(r.namespace().expect("namespace"), PLEXUS_NAMESPACE);
    }
    let copy = Copy::new();
    let mut renders = 0;
    for mode in MODES {
        for subset in subsets() {
            let components: Vec<String> = std::iter::once(mode)
                .chain(subset.iter().copied())
                .map(|c| format!("components/{c}"))
                .collect();
            let name = format!("{mode}-{}", subset.join("-"));
            let dir = copy.combo(&name, &components);
            let r = Rendered::render(&kubectl, &dir)
                .unwrap_or_else(|e| panic!("{name} does not render: {e:#}"));
            let mut expected: BTreeSet<String> = BASE.iter().map(|s| s.to_string()).collect();
            for c in std::iter::once(mode).chain(subset.iter().copied()) {
                expected.extend(component_objects(c).iter().map(|s| s.to_string()));
            }
            check(&r, &expected, PLEXUS_NAMESPACE, &image);
            renders += 1;
        }
    }
    assert_eq!(renders, MODES.len() << OPTIONAL_COMPONENTS.len());
    // The uninstall DaemonSet: the same namespace and image.
    let r = Rendered::render(&kubectl, &deploy_dir().join("uninstall")).expect("uninstall");
    let expected = BTreeSet::from(["DaemonSet/kube-plexus-ds".to_string()]);
    assert_eq!(names(&r), expected);
    for (what, ns) in namespaces(&r) {
        assert_eq!(ns, PLEXUS_NAMESPACE, "{what}");
    }
    for (what, i) in r.images() {
        assert_eq!(i, image, "{what}");
    }
}

#[test]
fn namespace_and_image_follow_the_settings_and_a_kustomization_on_top() {
    let Some(kubectl) = kubectl() else { return };
    let copy = Copy::new();
    let all: Vec<String> = OPTIONAL_COMPONENTS
        .iter()
        .map(|c| format!("components/{c}"))
        .collect();
    // 1. deploy/settings edited: its two lines.
    let settings = copy.root.join("settings/kustomization.yaml");
    let text = std::fs::read_to_string(&settings).expect("settings");
    let version = workspace_version();
    let edited = text
        .replace("namespace: kube-system", "namespace: plexus-system")
        .replace(
            &format!("newTag: \"{version}\""),
            "newName: registry.example/plexus\n    newTag: \"9.9.9\"",
        );
    assert_ne!(edited, text, "deploy/settings no longer has these lines");
    std::fs::write(&settings, edited).expect("write settings");
    for mode in MODES {
        let components: Vec<String> = std::iter::once(format!("components/{mode}"))
            .chain(all.iter().cloned())
            .collect();
        let dir = copy.combo(&format!("settings-{mode}"), &components);
        let r = Rendered::render(&kubectl, &dir).expect("render");
        let mut expected: BTreeSet<String> = BASE.iter().map(|s| s.to_string()).collect();
        for c in std::iter::once(mode).chain(OPTIONAL_COMPONENTS) {
            expected.extend(component_objects(c).iter().map(|s| s.to_string()));
        }
        check(
            &r,
            &expected,
            "plexus-system",
            "registry.example/plexus:9.9.9",
        );
        // The node restriction matches plexus' ServiceAccount wherever it is: through its
        // parameter (the ServiceAccount), not a namespace in the expression.
        let vap = r
            .find("ValidatingAdmissionPolicy", "plexus-node-restriction")
            .expect("node restriction");
        assert_eq!(vap["spec"]["paramKind"]["kind"], "ServiceAccount");
        let binding = r
            .find(
                "ValidatingAdmissionPolicyBinding",
                "plexus-node-restriction",
            )
            .expect("binding");
        assert_eq!(binding["spec"]["paramRef"]["name"], "plexus");
        let cond = vap["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .expect("matchCondition");
        assert!(cond.contains("params.metadata.namespace"), "{cond}");
    }
    let r = Rendered::render(&kubectl, &copy.root.join("uninstall")).expect("uninstall");
    for (what, ns) in namespaces(&r) {
        assert_eq!(ns, "plexus-system", "{what}");
    }
    for (what, i) in r.images() {
        assert_eq!(i, "registry.example/plexus:9.9.9", "{what}");
    }
    // 2. A user's kustomization on top of an overlay (the repository's settings as they are).
    std::fs::write(&settings, &text).expect("restore settings");
    for mode in MODES {
        let components: Vec<String> = std::iter::once(format!("components/{mode}"))
            .chain(all.iter().cloned())
            .collect();
        copy.combo(&format!("base-{mode}"), &components);
        let top = copy.root.join("combos").join(format!("top-{mode}"));
        std::fs::create_dir_all(&top).expect("mkdir");
        std::fs::write(
            top.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../base-{mode}\nnamespace: bank-net\nimages:\n  - name: plexus\n    newName: registry.example/plexus\n    newTag: \"1.2.3\"\n"
            ),
        )
        .expect("write");
        let r = Rendered::render(&kubectl, &top).expect("render");
        let mut expected: BTreeSet<String> = BASE.iter().map(|s| s.to_string()).collect();
        for c in std::iter::once(mode).chain(OPTIONAL_COMPONENTS) {
            expected.extend(component_objects(c).iter().map(|s| s.to_string()));
        }
        check(&r, &expected, "bank-net", "registry.example/plexus:1.2.3");
    }
}

#[test]
fn the_image_tag_is_the_workspace_version() {
    // The text of deploy/settings itself (no kubectl needed): `newTag: "<version>"`.
    let text = std::fs::read_to_string(deploy_dir().join("settings/kustomization.yaml"))
        .expect("deploy/settings/kustomization.yaml");
    let tags: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("newTag:"))
        .map(|v| v.trim().trim_matches('"'))
        .collect();
    assert_eq!(
        tags,
        [workspace_version().as_str()],
        "deploy/settings' image tag is not Cargo.toml's [workspace.package] version"
    );
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- name:"))
        .map(str::trim)
        .collect();
    assert_eq!(names, ["plexus"]);
}

/// The container of `mode`'s DaemonSet that serves metrics, and the DaemonSet's name.
fn metrics_container(mode: &str) -> (&'static str, &'static str) {
    match mode {
        "thin" => ("kube-plexus-ds", "reconcile"),
        _ => ("kube-plexus-daemon", "plexus-daemon"),
    }
}

fn container<'r>(r: &'r Rendered, ds: &str, name: &str) -> &'r Value {
    let d = r.find("DaemonSet", ds).expect("DaemonSet");
    d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{ds}: no container {name}"))
}

/// The value after `flag` in a container's command.
fn flag_value<'c>(c: &'c Value, flag: &str) -> Option<&'c str> {
    let cmd = c["command"].as_array()?;
    let i = cmd.iter().position(|a| a == flag)?;
    cmd.get(i + 1)?.as_str()
}

#[test]
fn the_metrics_component_serves_on_the_node_address_with_its_rbac_and_podmonitor() {
    let Some(kubectl) = kubectl() else { return };
    let copy = Copy::new();
    let image = format!("plexus:{}", workspace_version());
    for mode in MODES {
        // Without the component: the daemon's metrics stay node-local, nothing on thin's.
        let r = Rendered::render(&kubectl, &deploy_dir().join("overlays").join(mode))
            .expect("render overlay");
        let (ds, name) = metrics_container(mode);
        let c = container(&r, ds, name);
        match mode {
            "daemon" => assert_eq!(flag_value(c, "--metrics-address"), Some("127.0.0.1:9109")),
            _ => assert_eq!(flag_value(c, "--metrics-address"), None),
        }
        for with_podmonitor in [false, true] {
            let mut components = vec![format!("components/{mode}"), "components/metrics".into()];
            let mut parts = vec![mode, "metrics"];
            if with_podmonitor {
                components.push("components/metrics/podmonitor".into());
                parts.push("metrics/podmonitor");
            }
            let dir = copy.combo(&format!("metrics-{mode}-{with_podmonitor}"), &components);
            let r = Rendered::render(&kubectl, &dir).expect("render with metrics");
            let mut expected: BTreeSet<String> = BASE.iter().map(|s| s.to_string()).collect();
            for c in parts {
                expected.extend(component_objects(c).iter().map(|s| s.to_string()));
            }
            check(&r, &expected, PLEXUS_NAMESPACE, &image);
            let c = container(&r, ds, name);
            assert_eq!(
                flag_value(c, "--metrics-address"),
                Some("$(PLEXUS_NODE_IP):9109"),
                "{mode}: {c}"
            );
            let env = c["env"].as_array().expect("env");
            let ip = env
                .iter()
                .find(|e| e["name"] == "PLEXUS_NODE_IP")
                .unwrap_or_else(|| panic!("{mode}: no PLEXUS_NODE_IP in {c}"));
            assert_eq!(ip["valueFrom"]["fieldRef"]["fieldPath"], "status.hostIP");
            let ports = c["ports"].as_array().expect("ports");
            assert!(
                ports
                    .iter()
                    .any(|p| p["name"] == "metrics" && p["containerPort"] == 9109),
                "{mode}: {ports:?}"
            );
            // No other container changed: one metrics port per pod.
            let d = r.find("DaemonSet", ds).expect("DaemonSet");
            let with_ports = d["spec"]["template"]["spec"]["containers"]
                .as_array()
                .expect("containers")
                .iter()
                .filter(|c| c.get("ports").is_some())
                .count();
            assert_eq!(with_ports, 1, "{mode}");
            if mode == "daemon" {
                for probe in ["readinessProbe", "livenessProbe"] {
                    let g = &c[probe]["httpGet"];
                    assert_eq!(g["scheme"], "HTTPS", "{probe}: {g}");
                    assert_eq!(g["port"], 9109, "{probe}: {g}");
                    assert!(g.get("host").is_none(), "{probe} on the pod (node) IP: {g}");
                }
            }
            let reader = r
                .find("ClusterRole", "plexus-metrics-reader")
                .expect("reader");
            assert_eq!(reader["rules"][0]["nonResourceURLs"][0], "/metrics");
            assert_eq!(reader["rules"][0]["verbs"][0], "get");
            let auth = r.find("ClusterRole", "plexus-metrics-auth").expect("auth");
            let rules = serde_json::to_string(&auth["rules"]).expect("json");
            for r in ["tokenreviews", "subjectaccessreviews", "create"] {
                assert!(rules.contains(r), "plexus-metrics-auth: {rules}");
            }
            if with_podmonitor {
                let pm = r.find("PodMonitor", "plexus").expect("PodMonitor");
                let ep = &pm["spec"]["podMetricsEndpoints"][0];
                assert_eq!(ep["port"], "metrics");
                assert_eq!(ep["scheme"], "https");
                let labels = d["spec"]["template"]["metadata"]["labels"]["app"]
                    .as_str()
                    .expect("app label");
                let selected = pm["spec"]["selector"]["matchExpressions"][0]["values"]
                    .as_array()
                    .expect("values");
                assert!(selected.iter().any(|v| v == labels), "{mode}: {labels}");
                assert_eq!(
                    ep["bearerTokenSecret"]["name"], "plexus-metrics-scraper-token",
                    "{ep}"
                );
                scraper_follows(&r, PLEXUS_NAMESPACE);
            }
        }
    }
    // plexus' namespace moved in deploy/settings: the scraper's Secret, ServiceAccount and
    // binding subject, and the PodMonitor, move with it.
    let settings = copy.root.join("settings/kustomization.yaml");
    let text = std::fs::read_to_string(&settings).expect("settings");
    let edited = text.replace("namespace: kube-system", "namespace: plexus-system");
    assert_ne!(edited, text);
    std::fs::write(&settings, edited).expect("write settings");
    let dir = copy.combo(
        "metrics-moved",
        &[
            "components/daemon".into(),
            "components/metrics".into(),
            "components/metrics/podmonitor".into(),
        ],
    );
    let r = Rendered::render(&kubectl, &dir).expect("render");
    let mut expected: BTreeSet<String> = BASE.iter().map(|s| s.to_string()).collect();
    for c in ["daemon", "metrics", "metrics/podmonitor"] {
        expected.extend(component_objects(c).iter().map(|s| s.to_string()));
    }
    check(&r, &expected, "plexus-system", &image);
    scraper_follows(&r, "plexus-system");
}

/// The PodMonitor's scraper identity is in `ns`: its ServiceAccount, token Secret, binding
/// subject, and the PodMonitor itself.
fn scraper_follows(r: &Rendered, ns: &str) {
    let b = r
        .find("ClusterRoleBinding", "plexus-metrics-scraper")
        .expect("scraper binding");
    assert_eq!(b["roleRef"]["name"], "plexus-metrics-reader");
    assert_eq!(b["subjects"][0]["name"], "plexus-metrics-scraper");
    assert_eq!(b["subjects"][0]["namespace"], ns, "{b}");
    for (kind, name) in [
        ("ServiceAccount", "plexus-metrics-scraper"),
        ("Secret", "plexus-metrics-scraper-token"),
        ("PodMonitor", "plexus"),
    ] {
        let o = r.find(kind, name).expect(kind);
        assert_eq!(o["metadata"]["namespace"], ns, "{kind}/{name}");
    }
    let secret = r
        .find("Secret", "plexus-metrics-scraper-token")
        .expect("secret");
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "plexus-metrics-scraper"
    );
}
