//! A real Kubernetes control plane for tests: etcd and kube-apiserver (TLS, static admin
//! token in `system:masters`, ServiceAccount tokens, `Node,RBAC`, audit log) on free loopback
//! ports, in directories of its own, started once per test binary and always cleaned up.
//!
//! The binaries come from `PLEXUS_K8S_BIN` (see [`bins`]); without them a tier prints
//! [`bins::skip_message`] and passes, unless `PLEXUS_K8S_REQUIRE=1` (CI) makes that a failure.
//! Use it from a `harness = false` test target whose `main` starts one [`ControlPlane`] and runs
//! its cases through a [`Suite`]:
//!
//! ```no_run
//! use plexus_e2e::realk8s::{ControlPlane, Suite};
//!
//! fn main() -> std::process::ExitCode {
//!     let Some(bins) = plexus_e2e::realk8s::bins_or_skip() else {
//!         return std::process::ExitCode::SUCCESS;
//!     };
//!     let cp = ControlPlane::start(&bins).expect("control plane");
//!     let mut suite = Suite::new("real_api");
//!     suite.case("namespace", || {
//!         cp.create_namespace("t1")?;
//!         let ns = cp.get_json("/api/v1/namespaces/t1")?;
//!         anyhow::ensure!(ns["metadata"]["name"] == "t1");
//!         Ok(())
//!     });
//!     suite.finish()
//! }
//! ```
//!
//! What a tier sets up on top of the control plane — `deploy/` manifests, namespaces, plexus'
//! token and kubeconfig, the control loops, a node with its overlay, install.sh, the daemon — is
//! the one rig in [`rig`] and [`node_rig`]; every real tier uses it.
//!
//! Processes run in their own process groups and are killed on drop (and by `SIGKILL` if the
//! thread that started them dies): create the control plane on the main thread. Its directory
//! (certificates, `apiserver.log`, `audit.log`, kubeconfigs) is removed on drop unless
//! `PLEXUS_K8S_KEEP` is set, for a look after a failure.

pub mod audit;
pub mod bins;
pub mod cri; // node tier (real_node): cri, image, node, pause
pub mod deploy;
pub mod fault_proxy;
pub mod fault_rules;
mod https;
pub mod image;
pub mod metrics;
pub mod node;
pub mod node_rig;
pub mod overlay;
pub mod overlay_hostroot;
pub mod pause;
pub mod pki;
mod proc;
pub mod rig;
pub mod runtime_log;
pub mod runtimes;
mod suite;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

pub use audit::AuditEntry;
pub use bins::K8sBins;
pub use metrics::{RequestCounts, RequestKey};
pub use pki::CertPair;
pub use proc::Proc;
pub use suite::{
    bins_or_skip, control_plane_or_skip, control_plane_with_service_range_or_skip, setup_or_report,
    CliArgs, Suite,
};

use https::HttpsGet;
use pki::Ca;

/// User name of the static admin token (group `system:masters`).
pub const ADMIN_USER: &str = "plexus-admin";

/// A running etcd + kube-apiserver. Dropping it stops both and removes its directories.
pub struct ControlPlane {
    bins: K8sBins,
    ca: Ca,
    admin_token: String,
    port: u16,
    http: HttpsGet,
    apiserver_args: Vec<String>,
    apiserver: Mutex<Option<Proc>>,
    // Field order is drop order: processes before the directories they use.
    etcd: Proc,
    etcd_dir: tempfile::TempDir,
    dir: tempfile::TempDir,
}

/// The file in a control plane's directory naming the test process that owns it.
pub(crate) const OWNER_FILE: &str = "owner-pid";

/// The Services' range of an IPv4 cluster (every tier's unless it asks otherwise).
pub const SERVICE_RANGE_V4: &str = "10.96.0.0/16";

/// The Services' ranges of a dual-stack cluster (IPv4 first: the primary family).
pub const SERVICE_RANGE_DUAL: &str = "10.96.0.0/16,fd00:10:96::/112";

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl ControlPlane {
    /// Start etcd and kube-apiserver in a fresh temporary directory and wait for `/readyz`.
    pub fn start(bins: &K8sBins) -> Result<ControlPlane> {
        Self::start_with_service_range(bins, SERVICE_RANGE_V4)
    }

    /// [`ControlPlane::start`] with `--service-cluster-ip-range=<range>`: a comma-separated
    /// pair (one range per family, e.g. [`SERVICE_RANGE_DUAL`]) makes a dual-stack cluster.
    pub fn start_with_service_range(bins: &K8sBins, range: &str) -> Result<ControlPlane> {
        let t0 = Instant::now();
        // 0700: it holds the CA's and the apiserver's keys and the admin token.
        let dir = tempfile::Builder::new()
            .prefix("plexus-k8s-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()?;
        // etcd fsyncs a lot: keep its data in memory where there is a tmpfs.
        let shm = Path::new("/dev/shm");
        let etcd_dir = if shm.is_dir() {
            tempfile::Builder::new()
                .prefix("plexus-etcd-")
                .tempdir_in(shm)?
        } else {
            tempfile::Builder::new()
                .prefix("plexus-etcd-")
                .tempdir_in(dir.path())?
        };
        let d = |p: &str| dir.path().join(p);
        // Whose it is: a node's sweep of killed runs keeps the directory of a live test process
        // even while its apiserver is stopped (a case that stops it).
        std::fs::write(d(OWNER_FILE), std::process::id().to_string())?;

        let ca = Ca::new()?;
        let serving = ca.serving()?;
        let (sa_key, sa_pub) = pki::service_account_key()?;
        let admin_token = format!("admin-{:x}", rand_u64());
        write(&d("ca.crt"), &ca.pem())?;
        write(&d("apiserver.crt"), &serving.cert_pem)?;
        write(&d("apiserver.key"), &serving.key_pem)?;
        write(&d("sa.key"), &sa_key)?;
        write(&d("sa.pub"), &sa_pub)?;
        write(
            &d("tokens.csv"),
            &format!("{admin_token},{ADMIN_USER},{ADMIN_USER},\"system:masters\"\n"),
        )?;
        write(&d("audit-policy.yaml"), audit::POLICY)?;

        let (client, peer) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let etcd_args: Vec<String> = vec![
            "--name=default".into(),
            format!("--data-dir={}", etcd_dir.path().join("data").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--log-level=warn".into(),
        ];
        let etcd = Proc::spawn("etcd", Path::new("etcd"), &etcd_args, &d("etcd.log"))?;

        let port = free_port()?;
        let p = |name: &str| d(name).display().to_string();
        let apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", p("certs")),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            format!("--service-cluster-ip-range={range}"),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            format!("--audit-policy-file={}", p("audit-policy.yaml")),
            format!("--audit-log-path={}", p("audit.log")),
        ];
        let http = HttpsGet::new(port, &ca.der(), &admin_token)?;
        let cp = ControlPlane {
            bins: bins.clone(),
            ca,
            admin_token,
            port,
            http,
            apiserver_args,
            apiserver: Mutex::new(None),
            etcd,
            etcd_dir,
            dir,
        };
        cp.write_kubeconfig(&cp.admin_kubeconfig(), &cp.admin_token.clone())?;
        cp.start_apiserver()?;
        eprintln!(
            "realk8s: control plane ready at {} in {:.1} s (dir {})",
            cp.url(),
            t0.elapsed().as_secs_f64(),
            cp.dir().display()
        );
        Ok(cp)
    }

    /// Start kube-apiserver (again, same port and flags) and wait until `/readyz` answers 200.
    pub fn start_apiserver(&self) -> Result<()> {
        let mut slot = self.apiserver.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() {
            return Ok(());
        }
        let log = self.dir().join("apiserver.log");
        let mut proc = Proc::spawn(
            "kube-apiserver",
            &self.bins.apiserver,
            &self.apiserver_args,
            &log,
        )?;
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok((200, _)) = self.http.get("/readyz") {
                break;
            }
            if let Err(e) = proc.check_alive() {
                bail!("{e}\n{}", tail(&log, 30));
            }
            if Instant::now() > deadline {
                bail!("kube-apiserver not ready after 90 s\n{}", tail(&log, 30));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        *slot = Some(proc);
        Ok(())
    }

    /// Stop kube-apiserver (etcd keeps running); [`ControlPlane::start_apiserver`] brings it back.
    /// SIGTERM, then SIGKILL after 2 s: on SIGTERM it stops listening at once, then lingers
    /// (every stop with a 10 s grace ended in the SIGKILL, 10.2 s after "Stopped listening").
    pub fn stop_apiserver(&self) {
        let proc = self
            .apiserver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut p) = proc {
            p.stop(Duration::from_secs(2));
        }
    }

    /// `https://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The apiserver's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The control plane's own directory (certificates, logs, audit log, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The binaries in use.
    pub fn bins(&self) -> &K8sBins {
        &self.bins
    }

    /// Path of the CA certificate (PEM) that signed the serving certificate; it is also the
    /// apiserver's `--client-ca-file`.
    pub fn ca_path(&self) -> PathBuf {
        self.dir().join("ca.crt")
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// The CA certificate, DER.
    pub fn ca_der(&self) -> Vec<u8> {
        self.ca.der()
    }

    /// A fresh serving certificate for `127.0.0.1` signed by the cluster CA (e.g. for a proxy
    /// in front of the apiserver that clients with the cluster's kubeconfig CA trust).
    pub fn serving_cert(&self) -> Result<CertPair> {
        Ok(self.ca.serving()?)
    }

    /// The static admin token (`system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A kubeconfig with the admin token.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir().join("admin.kubeconfig")
    }

    /// The apiserver's log file.
    pub fn apiserver_log(&self) -> PathBuf {
        self.dir().join("apiserver.log")
    }

    /// A client certificate signed by the cluster CA (user = CN, group = O), e.g. for a kubelet:
    /// `client_cert("system:node:n1", Some("system:nodes"))`.
    pub fn client_cert(&self, user: &str, group: Option<&str>) -> Result<CertPair> {
        Ok(self.ca.client(user, group)?)
    }

    /// Write a kubeconfig (mode 0600) that authenticates with bearer `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        crate::apiserver::kubeconfig::write(path, &self.url(), Some(&self.ca_pem()), token)
            .with_context(|| format!("write {}", path.display()))
    }

    /// Write a kubeconfig (mode 0600) that authenticates with a client certificate.
    pub fn write_cert_kubeconfig(&self, path: &Path, cert: &CertPair) -> Result<()> {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \"{}\"\n    certificate-authority-data: \"{}\"\n\
             users:\n- name: u\n  user:\n    client-certificate-data: \"{}\"\n    client-key-data: \"{}\"\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
            self.url(),
            b64(&self.ca_pem()),
            b64(&cert.cert_pem),
            b64(&cert.key_pem)
        );
        write_private(path, &text)
    }

    /// Run `kubectl` as the admin; stdout, or an error with stderr when it fails.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_stdin(args, None)
    }

    /// Run `kubectl` as the admin with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        use std::io::Write as _;
        use std::process::Stdio;
        let mut cmd = Command::new(&self.bins.kubectl);
        cmd.arg(format!(
            "--kubeconfig={}",
            self.admin_kubeconfig().display()
        ))
        .arg(format!(
            "--cache-dir={}",
            self.dir().join("kubectl-cache").display()
        ))
        .args(args)
        .env("KUBECONFIG", self.admin_kubeconfig())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("run kubectl")?;
        let mut pipe = child.stdin.take().context("kubectl stdin")?;
        if let Some(s) = stdin {
            pipe.write_all(s.as_bytes())?;
        }
        drop(pipe);
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `kubectl apply -f <path>` as the admin.
    pub fn apply_file(&self, path: &Path) -> Result<String> {
        let p = path.display().to_string();
        self.kubectl(&["apply", "-f", &p])
    }

    /// The AddressClaims of network `ns/network` (the CRD of
    /// `deploy/components/fixed-ips/address-claim-crd.yaml`, in the NAD's namespace `ns`), read as the admin: `(address, pod name, pod UID, node)`.
    pub fn address_claims(
        &self,
        ns: &str,
        network: &str,
    ) -> Result<Vec<(String, String, String, String)>> {
        let list = self.get_json(&format!(
            "/apis/plexus.cni.io/v1alpha1/namespaces/{ns}/addressclaims"
        ))?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["spec"]["network"] == format!("{ns}/{network}"))
            .map(|c| {
                let f = |k: &str| {
                    c["spec"]
                        .pointer(k)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                (f("/address"), f("/pod/name"), f("/pod/uid"), f("/node"))
            })
            .collect())
    }

    /// `kubectl apply -f` the repository's `deploy/` manifests in order, each a path under
    /// `deploy/` (e.g. `base/rbac.yaml`, `components/dra/rbac-dra.yaml`) or a bare file name
    /// found under `deploy/base` or `deploy/components/*` ([`deploy::deploy_file`]); then wait
    /// until the NetworkAttachmentDefinition CRD (and the AddressClaim CRD, when applied) is
    /// established. The API tiers apply single manifests this way; an install is
    /// [`ControlPlane::apply_kustomization`] (`kubectl apply -k deploy/overlays/<mode>`).
    pub fn apply_deploy(&self, files: &[&str]) -> Result<()> {
        let mut claims = false;
        for f in files {
            let path = deploy::deploy_file(f)?;
            claims |= path.ends_with("address-claim-crd.yaml");
            self.apply_file(&path)
                .with_context(|| format!("kubectl apply -f {}", path.display()))?;
        }
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/network-attachment-definitions.k8s.cni.cncf.io",
        ])?;
        if claims {
            self.kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/addressclaims.plexus.cni.io",
            ])?;
        }
        Ok(())
    }

    /// `kubectl apply -f -` of YAML or JSON text as the admin.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        self.kubectl_stdin(&["apply", "-f", "-"], Some(manifest))
    }

    /// Create (or keep) namespace `ns` with what pods need where no controller-manager runs:
    /// the `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap.
    pub fn create_namespace(&self, ns: &str) -> Result<()> {
        let ca = serde_json::Value::String(self.ca_pem());
        let manifest = format!(
            r#"{{"apiVersion":"v1","kind":"List","items":[
  {{"apiVersion":"v1","kind":"Namespace","metadata":{{"name":"{ns}"}}}},
  {{"apiVersion":"v1","kind":"ServiceAccount","metadata":{{"name":"default","namespace":"{ns}"}}}},
  {{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"kube-root-ca.crt","namespace":"{ns}"}},"data":{{"ca.crt":{ca}}}}}
]}}"#
        );
        self.apply(&manifest).map(drop)
    }

    /// A token for ServiceAccount `ns/name` from the TokenRequest API (valid 24 h).
    pub fn create_token(&self, ns: &str, name: &str) -> Result<String> {
        let t = self.kubectl(&["create", "token", name, "-n", ns, "--duration=24h"])?;
        Ok(t.trim().to_string())
    }

    /// GET `path` as the admin: (status code, body).
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        self.http.get(path)
    }

    /// `method` `path` as the admin with an optional JSON body: (status code, body). No client
    /// process and no discovery requests, so only this request reaches the apiserver's counters.
    pub fn send(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        self.http.send(method, path, body)
    }

    /// The apiserver's `/metrics` text.
    pub fn metrics_text(&self) -> Result<String> {
        let (code, body) = self.http.get("/metrics")?;
        if code != 200 {
            bail!("GET /metrics: HTTP {code}");
        }
        Ok(body)
    }

    /// Process ids of kube-apiserver (while it runs) and etcd.
    pub fn pids(&self) -> (Option<u32>, Option<u32>) {
        let api = self
            .apiserver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Proc::pid);
        (api, self.etcd.pid())
    }

    /// GET `path` as the admin and parse JSON; an error unless 200.
    pub fn get_json(&self, path: &str) -> Result<Value> {
        let (code, body) = self.http.get(path)?;
        if code != 200 {
            bail!("GET {path}: HTTP {code}: {body}");
        }
        Ok(serde_json::from_str(&body)?)
    }

    /// `apiserver_request_total` summed by (verb, resource, subresource), over all users.
    pub fn request_totals(&self) -> Result<RequestCounts> {
        let (code, body) = self.http.get("/metrics")?;
        if code != 200 {
            bail!("GET /metrics: HTTP {code}");
        }
        Ok(metrics::parse_request_totals(&body))
    }

    /// Mean server-side latency (seconds) per (verb, resource, subresource) since start.
    pub fn mean_request_durations(&self) -> Result<std::collections::BTreeMap<RequestKey, f64>> {
        let (code, body) = self.http.get("/metrics")?;
        if code != 200 {
            bail!("GET /metrics: HTTP {code}");
        }
        Ok(metrics::parse_mean_durations(&body))
    }

    /// Every request in the audit log so far.
    pub fn audit(&self) -> Vec<AuditEntry> {
        audit::read(&self.dir().join("audit.log"))
    }

    /// Path of the etcd data directory (for diagnostics).
    pub fn etcd_dir(&self) -> &Path {
        self.etcd_dir.path()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop_apiserver();
        self.etcd.stop(Duration::from_secs(5));
        if std::env::var_os("PLEXUS_K8S_KEEP").is_some() {
            eprintln!("realk8s: keeping {}", self.dir().display());
            self.dir.disable_cleanup(true);
        }
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))
}

/// Write with mode 0600.
fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// The last `n` lines of a log file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// 64 unpredictable-enough bits for a per-run token (time, pid, ASLR).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id())
}
