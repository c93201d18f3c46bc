//! `KubeClient`: the API requests plexus makes, over a [`Transport`], built from a kubeconfig
//! file or the in-cluster service account.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use std::sync::Arc;

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, KubeconfigError, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use serde::de::DeserializeOwned;

use super::connect;
use super::error::{Ctx, K8sError};
use super::retry::RetryPolicy;
use super::transport::{Request, Transport};

/// Service-account token path inside a pod.
pub const SA_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// Service-account CA bundle path inside a pod.
pub const SA_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// Timeouts and retry budget of a [`KubeClient`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one request (connect + TLS + answer).
    pub request_timeout: Duration,
    /// Transient-error retry budget for NAD GETs and the status PATCH.
    pub retry: RetryPolicy,
    /// `reportingInstance` of posted events (the node name is a good choice).
    pub reporting_instance: String,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            retry: RetryPolicy::default(),
            reporting_instance: default_reporting_instance(),
        }
    }
}

impl ClientOptions {
    /// The defaults, reporting as Node `node` (empty: the host name).
    pub fn for_node(node: &str) -> Self {
        let mut o = ClientOptions::default();
        if !node.is_empty() {
            o.reporting_instance = node.to_string();
        }
        o
    }
}

/// The host name (from `/proc/sys/kernel/hostname`), else `"plexus"`.
fn default_reporting_instance() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "plexus".to_owned())
}

/// Where to reach the API server from inside a pod (`KUBERNETES_SERVICE_HOST/PORT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InClusterEnv {
    /// `KUBERNETES_SERVICE_HOST` (IP or DNS name).
    pub host: String,
    /// `KUBERNETES_SERVICE_PORT`.
    pub port: String,
    /// Bearer token file (re-read by kube when it rotates).
    pub token_file: PathBuf,
    /// CA bundle.
    pub ca_file: PathBuf,
}

impl InClusterEnv {
    /// From explicit host and port, with the standard service-account paths.
    pub fn new(host: impl Into<String>, port: impl Into<String>) -> Self {
        InClusterEnv {
            host: host.into(),
            port: port.into(),
            token_file: SA_TOKEN_FILE.into(),
            ca_file: SA_CA_FILE.into(),
        }
    }

    /// From the process environment; `None` unless both variables are set and non-empty.
    pub fn from_process_env() -> Option<Self> {
        let get = |k| std::env::var(k).ok().filter(|v: &String| !v.is_empty());
        Some(Self::new(
            get("KUBERNETES_SERVICE_HOST")?,
            get("KUBERNETES_SERVICE_PORT")?,
        ))
    }

    /// `https://host[:port]`, bracketing IPv6 literals.
    fn url(&self) -> Result<String, K8sError> {
        let port: u16 = self.port.trim().parse().map_err(|_| {
            K8sError::InCluster(format!("invalid KUBERNETES_SERVICE_PORT {:?}", self.port))
        })?;
        let host = self.host.trim();
        if host.is_empty() {
            return Err(K8sError::InCluster("empty KUBERNETES_SERVICE_HOST".into()));
        }
        let host = match host.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
            _ => host.to_owned(),
        };
        Ok(if port == 443 {
            format!("https://{host}")
        } else {
            format!("https://{host}:{port}")
        })
    }

    /// An equivalent single-context kubeconfig.
    pub(crate) fn kubeconfig(&self) -> Result<Kubeconfig, K8sError> {
        let path_str = |p: &Path| {
            p.to_str()
                .map(str::to_owned)
                .ok_or_else(|| K8sError::InCluster(format!("non-UTF-8 path {}", p.display())))
        };
        Ok(Kubeconfig {
            clusters: vec![NamedCluster {
                name: "in-cluster".into(),
                cluster: Some(Cluster {
                    server: Some(self.url()?),
                    certificate_authority: Some(path_str(&self.ca_file)?),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: "in-cluster".into(),
                auth_info: Some(AuthInfo {
                    token_file: Some(path_str(&self.token_file)?),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            contexts: vec![NamedContext {
                name: "in-cluster".into(),
                context: Some(Context {
                    cluster: "in-cluster".into(),
                    user: Some("in-cluster".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            current_context: Some("in-cluster".into()),
            ..Default::default()
        })
    }
}

/// A Kubernetes API client: request building, status handling and retries over a
/// [`Transport`] (the thin plugin's HTTP/1.1 client, or the daemon's `kube::Client`).
///
/// Cheap to clone (the transport and its idle connections are shared).
#[derive(Clone)]
pub struct KubeClient {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) opts: ClientOptions,
    /// Until when this API server is known to lack the `AddressClaim` CRD or the right to it
    /// (`address_claims`), shared by the client's clones.
    pub(crate) claims_off_until: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl KubeClient {
    /// Pick the source like Multus: a non-empty `kubeconfig` path wins, else the in-cluster
    /// service account when `in_cluster` is given (see [`InClusterEnv::from_process_env`]),
    /// else no client (`Ok(None)`: the caller runs without the API).
    pub async fn from_settings(
        kubeconfig: Option<&Path>,
        in_cluster: Option<&InClusterEnv>,
        opts: ClientOptions,
    ) -> Result<Option<Self>, K8sError> {
        match (kubeconfig.filter(|p| !p.as_os_str().is_empty()), in_cluster) {
            (Some(path), _) => Self::from_kubeconfig_path_with(path, opts).await.map(Some),
            (None, Some(env)) => Self::in_cluster(env, opts).await.map(Some),
            (None, None) => Ok(None),
        }
    }

    /// Build from a kubeconfig file with default [`ClientOptions`].
    pub async fn from_kubeconfig_path(path: &Path) -> Result<Self, K8sError> {
        Self::from_kubeconfig_path_with(path, ClientOptions::default()).await
    }

    /// Build from a kubeconfig file. Warns when the file is readable by everyone (it may hold a
    /// bearer token).
    pub async fn from_kubeconfig_path_with(
        path: &Path,
        opts: ClientOptions,
    ) -> Result<Self, K8sError> {
        let kubeconfig = read_kubeconfig(path)?;
        let transport = connect::transport_from_kubeconfig(&kubeconfig, opts.connect_timeout)
            .map_err(|e| match e.transient {
                true => K8sError::CredentialUnavailable {
                    path: path.to_owned(),
                    reason: e.reason,
                },
                false => K8sError::Kubeconfig {
                    path: path.to_owned(),
                    reason: e.reason,
                },
            })?;
        Ok(Self::with_transport(Arc::new(transport), opts))
    }

    /// Build from the in-cluster service account.
    pub async fn in_cluster(env: &InClusterEnv, opts: ClientOptions) -> Result<Self, K8sError> {
        let kubeconfig = env.kubeconfig()?;
        let transport = connect::transport_from_kubeconfig(&kubeconfig, opts.connect_timeout)
            .map_err(|e| K8sError::InCluster(e.reason))?;
        Ok(Self::with_transport(Arc::new(transport), opts))
    }

    /// A client over `transport`.
    pub(crate) fn with_transport(transport: Arc<dyn Transport>, opts: ClientOptions) -> Self {
        KubeClient {
            transport,
            opts,
            claims_off_until: Arc::default(),
        }
    }

    /// The same connection with other options (e.g. one quick attempt for a DEL).
    pub fn with_options(&self, opts: ClientOptions) -> Self {
        KubeClient {
            transport: Arc::clone(&self.transport),
            opts,
            claims_off_until: Arc::clone(&self.claims_off_until),
        }
    }

    /// The options in use.
    pub fn options(&self) -> &ClientOptions {
        &self.opts
    }

    /// The `kube::Client` under this client, when it has one (the daemon's, for its watches).
    pub fn kube_client(&self) -> Option<kube::Client> {
        self.transport.kube_client()
    }

    /// One attempt: send `req`; a non-success answer becomes [`K8sError::Api`].
    pub(crate) async fn exchange(&self, ctx: Ctx<'_>, req: Request) -> Result<Vec<u8>, K8sError> {
        let (verb, resource) = super::api_labels::of(req.method(), req.uri());
        let answer = self.transport.send(req).await;
        let code = match &answer {
            Ok(a) => super::api_labels::code(a.status().as_u16()),
            Err(_) => "error",
        };
        crate::outcome::api_request(verb, resource, code);
        let answer = answer.map_err(|e| K8sError::from_transport(ctx, e))?;
        let status = answer.status();
        let body = answer.into_body();
        if status.is_success() {
            Ok(body)
        } else {
            Err(K8sError::from_answer(ctx, status.as_u16(), &body))
        }
    }

    /// One attempt whose answer is the JSON of a `T`.
    pub(crate) async fn fetch<T: DeserializeOwned>(
        &self,
        ctx: Ctx<'_>,
        req: Request,
    ) -> Result<T, K8sError> {
        let body = self.exchange(ctx, req).await?;
        serde_json::from_slice(&body).map_err(|e| K8sError::Decode {
            what: ctx.what,
            ns: ctx.ns.to_owned(),
            name: ctx.name.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// A request built by `kube::core`, or the reason it could not be.
pub(crate) fn built(
    ctx: Ctx<'_>,
    req: Result<Request, kube::core::request::Error>,
) -> Result<Request, K8sError> {
    req.map_err(|e| K8sError::Other {
        what: ctx.what,
        ns: ctx.ns.to_owned(),
        name: ctx.name.to_owned(),
        reason: format!("building the request: {e}"),
    })
}

/// Read a kubeconfig file (warning when everyone can read it: it may hold credentials).
pub(crate) fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, K8sError> {
    let kc_err = |reason: String| K8sError::Kubeconfig {
        path: path.to_owned(),
        reason,
    };
    match std::fs::metadata(path) {
        Ok(md) if md.permissions().mode() & 0o004 != 0 => tracing::warn!(
            path = %path.display(),
            "kubeconfig is world-readable; it may contain credentials, consider chmod 600"
        ),
        Ok(_) => {}
        Err(e) => return Err(kc_err(format!("cannot read: {e}"))),
    }
    Kubeconfig::read_from(path).map_err(|e| kc_err(redact(&e)))
}

/// Describe a kubeconfig error without echoing file contents.
pub(crate) fn redact(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(_) => {
            "invalid YAML (details withheld: the file may contain credentials)".to_owned()
        }
        other => other.to_string(),
    }
}

/// Install the ring rustls provider once; tolerate one installed by someone else.
pub(crate) fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Err only means another thread installed one first: fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_configured_node_name_is_the_reporting_instance() {
        assert_eq!(
            ClientOptions::for_node("worker-7").reporting_instance,
            "worker-7"
        );
        assert_eq!(
            ClientOptions::for_node("").reporting_instance,
            ClientOptions::default().reporting_instance
        );
    }

    #[test]
    fn in_cluster_url() {
        assert_eq!(
            InClusterEnv::new("10.96.0.1", "443").url().unwrap(),
            "https://10.96.0.1"
        );
        assert_eq!(
            InClusterEnv::new("fd00::1", "6443").url().unwrap(),
            "https://[fd00::1]:6443"
        );
        assert_eq!(
            InClusterEnv::new("api.example", "8443").url().unwrap(),
            "https://api.example:8443"
        );
        assert!(matches!(
            InClusterEnv::new("10.96.0.1", "x").url(),
            Err(K8sError::InCluster(_))
        ));
        assert!(InClusterEnv::new("", "443").url().is_err());
    }

    #[tokio::test]
    async fn from_settings_picks_the_source() {
        let none = KubeClient::from_settings(Some(Path::new("")), None, ClientOptions::default());
        assert!(none.await.unwrap().is_none());
        let mut env = InClusterEnv::new("10.96.0.1", "443");
        env.ca_file = "/nonexistent/plexus-ca.crt".into();
        let err = KubeClient::from_settings(None, Some(&env), ClientOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::InCluster(_)), "{err:?}");
        let err = KubeClient::from_settings(
            Some(Path::new("/nonexistent/kc")),
            Some(&env),
            ClientOptions::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, K8sError::Kubeconfig { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn in_cluster_with_missing_ca_fails_cleanly() {
        let mut env = InClusterEnv::new("10.96.0.1", "443");
        env.ca_file = "/nonexistent/plexus-ca.crt".into();
        let err = KubeClient::in_cluster(&env, ClientOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::InCluster(_)), "{err:?}");
        assert_eq!(err.cni_code(), 7);
    }

    #[tokio::test]
    async fn bad_kubeconfig_is_reported_without_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kc");
        std::fs::write(&path, "token: s3cr3t-token\n  : [unbalanced").unwrap();
        let err = KubeClient::from_kubeconfig_path(&path).await.unwrap_err();
        assert!(matches!(err, K8sError::Kubeconfig { .. }), "{err:?}");
        assert!(!err.to_string().contains("s3cr3t"), "{err}");
        assert_eq!(err.cni_code(), 7);

        let err = KubeClient::from_kubeconfig_path(&dir.path().join("missing"))
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::Kubeconfig { .. }), "{err:?}");
    }

    /// A real kubeconfig against a one-shot plain-HTTP server on loopback: the client speaks
    /// HTTP/1 to `http://`, sends the bearer token, and the request shape is right.
    #[tokio::test]
    async fn plain_http_kubeconfig_end_to_end() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = sock.read(&mut chunk).await.unwrap();
                assert!(n > 0, "client closed early");
                buf.extend_from_slice(&chunk[..n]);
            }
            let body = br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1","namespace":"ns1","uid":"u1"}}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).await.unwrap();
            sock.write_all(body).await.unwrap();
            String::from_utf8(buf).unwrap()
        });

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\n\
                 users:\n- name: u\n  user:\n    token: tok-123\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
                 current-context: x\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

        let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
        let pod = client
            .get_pod("ns1", "p1", Some("u1"), RetryPolicy::none())
            .await
            .unwrap()
            .expect("pod");
        assert_eq!(pod.metadata.uid.as_deref(), Some("u1"));
        let req = server.await.unwrap();
        assert!(
            req.starts_with("GET /api/v1/namespaces/ns1/pods/p1 HTTP/1.1\r\n"),
            "{req}"
        );
        assert!(
            req.to_ascii_lowercase()
                .contains("authorization: bearer tok-123\r\n"),
            "{req}"
        );
    }

    /// An exec credential plugin that fails (its token service is down) is code 11, so the
    /// runtime retries; one that cannot run at all is a kubeconfig error (7).
    #[tokio::test]
    async fn exec_credential_failures_are_classified() {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("cred");
        std::fs::write(
            &plugin,
            "#!/bin/sh\necho 'token service unreachable' >&2\nexit 1\n",
        )
        .unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o700)).unwrap();
        let kc = |command: &Path| {
            let path = dir.path().join("kubeconfig");
            std::fs::write(
                &path,
                format!(
                    "clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n\
                     users:\n- name: u\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {}\n\
                     contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
                    command.display()
                ),
            )
            .unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            path
        };
        let err = KubeClient::from_kubeconfig_path(&kc(&plugin))
            .await
            .unwrap_err();
        assert!(
            matches!(err, K8sError::CredentialUnavailable { .. }),
            "{err:?}"
        );
        assert_eq!(err.cni_code(), 11);
        assert!(
            err.to_string().contains("token service unreachable"),
            "{err}"
        );

        let err = KubeClient::from_kubeconfig_path(&kc(&dir.path().join("missing")))
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::Kubeconfig { .. }), "{err:?}");
        assert_eq!(err.cni_code(), 7);
    }

    #[tokio::test]
    async fn connection_refused_is_transient() {
        // Bind then drop to get a loopback port with (almost certainly) no listener.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\n\
                 contexts:\n- name: x\n  context:\n    cluster: c\ncurrent-context: x\n"
            ),
        )
        .unwrap();
        let client = KubeClient::from_kubeconfig_path(&path).await.unwrap();
        let err = client
            .get_pod("ns1", "p1", None, RetryPolicy::none())
            .await
            .unwrap_err();
        assert!(matches!(err, K8sError::Unreachable { .. }), "{err:?}");
        assert_eq!(err.cni_code(), 11);
    }
}
