//! `deploy/` as users install it: a kustomize base (`deploy/base`), the modes' and the optional
//! components (`deploy/components/<name>`), the namespace and image set once
//! (`deploy/settings`), and one overlay per mode (`deploy/overlays/<mode>`), applied with
//! `kubectl apply -k` and removed with `kubectl delete -k` (kustomize is built into kubectl).
//!
//! [`Rendered`] is what a kustomization holds, rendered by the tier's own kubectl
//! (`kubectl kustomize`, then converted to JSON offline): the node tiers read the DaemonSet they
//! run from what the overlay applied, and [`ControlPlane::delete_kustomization`] checks that
//! none of those objects is left.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use super::ControlPlane;

/// The install modes: `deploy/overlays/<mode>`.
pub const MODES: [&str; 2] = ["thin", "daemon"];

/// The optional components (`deploy/components/<name>`) an overlay may add; `thin` and `daemon`
/// are the modes' own.
pub const OPTIONAL_COMPONENTS: [&str; 4] = ["fixed-ips", "dra", "nad-policy", "node-restriction"];

/// The repository's `deploy/` directory.
pub fn deploy_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    d.canonicalize().unwrap_or(d)
}

/// `deploy/<rel>` when it exists; else, for a bare file name, the one file of that name under
/// `deploy/base` or `deploy/components/*` (where the manifests once at `deploy/`'s top live).
pub fn deploy_file(rel: &str) -> Result<PathBuf> {
    let dir = deploy_dir();
    let direct = dir.join(rel);
    if direct.exists() || rel.contains('/') {
        return Ok(direct);
    }
    let mut found = Vec::new();
    let mut dirs = vec![dir.join("base")];
    for e in std::fs::read_dir(dir.join("components"))? {
        dirs.push(e?.path());
    }
    for d in dirs {
        if d.join(rel).is_file() {
            found.push(d.join(rel));
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => bail!("no {rel} in deploy/, deploy/base or deploy/components/*"),
        _ => bail!("{rel} is ambiguous in deploy/: {found:?}"),
    }
}

/// The objects of one kustomization, as `kubectl kustomize` renders them.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The kustomization's directory.
    pub dir: PathBuf,
    /// The rendered YAML.
    pub yaml: String,
    /// Each object as JSON (in the rendered order).
    pub objects: Vec<Value>,
}

impl Rendered {
    /// `kubectl kustomize dir` with `kubectl` (no API server), each object converted to JSON by
    /// `kubectl annotate --local` (which changes nothing but adds an empty annotation map).
    pub fn render(kubectl: &Path, dir: &Path) -> Result<Rendered> {
        let out = Command::new(kubectl)
            .arg("kustomize")
            .arg(dir)
            .env("KUBECONFIG", "/dev/null")
            .output()
            .context("run kubectl kustomize")?;
        ensure!(
            out.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let yaml = String::from_utf8(out.stdout).context("kustomize output")?;
        let mut child = Command::new(kubectl)
            .args([
                "annotate",
                "--local",
                "-f",
                "-",
                "-o",
                "json",
                "plexus.cni.io/none-",
            ])
            .env("KUBECONFIG", "/dev/null")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("run kubectl annotate --local")?;
        {
            use std::io::Write as _;
            let mut stdin = child.stdin.take().context("stdin")?;
            stdin.write_all(yaml.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "kubectl annotate --local (YAML to JSON) of {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let objects = serde_json::Deserializer::from_slice(&out.stdout)
            .into_iter::<Value>()
            .collect::<std::result::Result<Vec<_>, _>>()
            .context("kubectl's JSON")?;
        Ok(Rendered {
            dir: dir.to_path_buf(),
            yaml,
            objects,
        })
    }

    /// The object of `kind` named `name`.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }

    /// The namespace plexus is installed in: its ServiceAccount's.
    pub fn namespace(&self) -> Result<String> {
        let sa = self
            .find("ServiceAccount", "plexus")
            .with_context(|| format!("no ServiceAccount plexus in {}", self.dir.display()))?;
        Ok(sa["metadata"]["namespace"]
            .as_str()
            .context("the ServiceAccount's namespace")?
            .to_string())
    }

    /// Every container image of every pod template (DaemonSets), with the object it is in.
    pub fn images(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        for o in &self.objects {
            let spec = &o["spec"]["template"]["spec"];
            for list in ["initContainers", "containers"] {
                for c in spec[list].as_array().into_iter().flatten() {
                    if let Some(i) = c["image"].as_str() {
                        v.push((Self::id(o), i.to_string()));
                    }
                }
            }
        }
        v
    }

    /// `Kind/name` (and ` in namespace` when it has one) of `o`, for messages.
    pub fn id(o: &Value) -> String {
        let name = o["metadata"]["name"].as_str().unwrap_or("?");
        match o["metadata"]["namespace"].as_str() {
            Some(ns) => format!("{}/{name} in {ns}", o["kind"].as_str().unwrap_or("?")),
            None => format!("{}/{name}", o["kind"].as_str().unwrap_or("?")),
        }
    }

    /// kubectl's name for `o`'s resource type: `kind.group` (`serviceaccount` for core).
    fn resource(o: &Value) -> String {
        let kind = o["kind"].as_str().unwrap_or("").to_ascii_lowercase();
        match o["apiVersion"].as_str().and_then(|v| v.split_once('/')) {
            Some((group, _)) => format!("{kind}.{group}"),
            None => kind,
        }
    }
}

impl ControlPlane {
    /// `deploy/<dir>` (e.g. `overlays/thin`) rendered by this cluster's kubectl.
    pub fn render_kustomization(&self, dir: &str) -> Result<Rendered> {
        Rendered::render(&self.bins().kubectl, &deploy_dir().join(dir))
    }

    /// `kubectl apply -k deploy/<dir>` as users install plexus (e.g. `overlays/thin`), then wait
    /// until the CRDs it holds are established. Returns what it applied.
    pub fn apply_kustomization(&self, dir: &str) -> Result<Rendered> {
        let rendered = self.render_kustomization(dir)?;
        self.kubectl(&["apply", "-k", &rendered.dir.display().to_string()])
            .with_context(|| format!("kubectl apply -k deploy/{dir}"))?;
        for o in &rendered.objects {
            if o["kind"] == "CustomResourceDefinition" {
                let name = o["metadata"]["name"].as_str().context("CRD name")?;
                self.kubectl(&[
                    "wait",
                    "--for=condition=Established",
                    "--timeout=60s",
                    &format!("crd/{name}"),
                ])?;
            }
        }
        Ok(rendered)
    }

    /// `kubectl delete -k deploy/<dir>` (waiting for each deletion, finalizers included), then
    /// an error naming any of its objects the API still has.
    pub fn delete_kustomization(&self, dir: &str) -> Result<()> {
        let rendered = self.render_kustomization(dir)?;
        self.kubectl(&[
            "delete",
            "-k",
            &rendered.dir.display().to_string(),
            "--ignore-not-found",
            "--wait",
            "--timeout=120s",
        ])
        .with_context(|| format!("kubectl delete -k deploy/{dir}"))?;
        let left = self.still_there(&rendered)?;
        ensure!(
            left.is_empty(),
            "after kubectl delete -k deploy/{dir}, the API still has: {}",
            left.join(", ")
        );
        Ok(())
    }

    /// Which of `rendered`'s objects the API has (`Kind/name` of each).
    pub fn still_there(&self, rendered: &Rendered) -> Result<Vec<String>> {
        let mut left = Vec::new();
        for o in &rendered.objects {
            let name = o["metadata"]["name"].as_str().context("name")?;
            let mut args = vec![
                "get".to_string(),
                Rendered::resource(o),
                name.to_string(),
                "--ignore-not-found".to_string(),
                "-o".to_string(),
                "name".to_string(),
            ];
            if let Some(ns) = o["metadata"]["namespace"].as_str() {
                args.extend(["-n".to_string(), ns.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            if !self.kubectl(&args)?.trim().is_empty() {
                left.push(Rendered::id(o));
            }
        }
        Ok(left)
    }
}
