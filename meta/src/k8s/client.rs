//! `KubeClient`: one `kube::Client` over a TCP_NODELAY connector, built from a kubeconfig
//! file or the in-cluster service account.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, KubeconfigError, NamedAuthInfo,
    NamedCluster, NamedContext,
};
use tower::{BoxError, ServiceBuilder};

use super::error::K8sError;
use super::retry::RetryPolicy;

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
    fn kubeconfig(&self) -> Result<Kubeconfig, K8sError> {
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

/// A Kubernetes API client for one CNI invocation.
///
/// Cheap to clone (the underlying connection pool is shared).
#[derive(Clone)]
pub struct KubeClient {
    pub(crate) client: kube::Client,
    pub(crate) opts: ClientOptions,
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

    /// Build from a kubeconfig file with default [`ClientOptions`]. Must run inside a tokio runtime.
    pub async fn from_kubeconfig_path(path: &Path) -> Result<Self, K8sError> {
        Self::from_kubeconfig_path_with(path, ClientOptions::default()).await
    }

    /// Build from a kubeconfig file. Warns when the file is readable by everyone (it may hold a
    /// bearer token). Must run inside a tokio runtime.
    pub async fn from_kubeconfig_path_with(
        path: &Path,
        opts: ClientOptions,
    ) -> Result<Self, K8sError> {
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
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| kc_err(redact(&e)))?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| kc_err(redact(&e)))?;
        trim_token_file(&mut config.auth_info).map_err(kc_err)?;
        let client = build_client(&config, &opts).map_err(|e| match e {
            K8sError::Client(reason) => kc_err(reason),
            other => other,
        })?;
        Ok(KubeClient { client, opts })
    }

    /// Build from the in-cluster service account. Must run inside a tokio runtime.
    pub async fn in_cluster(env: &InClusterEnv, opts: ClientOptions) -> Result<Self, K8sError> {
        let kubeconfig = env.kubeconfig()?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| K8sError::InCluster(redact(&e)))?;
        trim_token_file(&mut config.auth_info).map_err(K8sError::InCluster)?;
        let client = build_client(&config, &opts)?;
        Ok(KubeClient { client, opts })
    }

    /// Wrap an existing `kube::Client` (tests, or callers with their own stack).
    pub fn from_client(client: kube::Client, opts: ClientOptions) -> Self {
        KubeClient { client, opts }
    }

    /// The options in use.
    pub fn options(&self) -> &ClientOptions {
        &self.opts
    }
}

/// Describe a kubeconfig error without echoing file contents.
fn redact(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(_) => {
            "invalid YAML (details withheld: the file may contain credentials)".to_owned()
        }
        other => other.to_string(),
    }
}

/// kube sends a token file's contents verbatim, so a trailing newline (`echo tok > file`) makes
/// an invalid header. When the file has surrounding whitespace, read it once and use the trimmed
/// token inline (fine for a short-lived CNI process); otherwise leave it to kube, which re-reads
/// rotated tokens.
fn trim_token_file(auth: &mut AuthInfo) -> Result<(), String> {
    let Some(path) = auth.token_file.as_deref().filter(|_| auth.token.is_none()) else {
        return Ok(());
    };
    let raw =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read token file {path}: {e}"))?;
    let trimmed = raw.trim();
    if trimmed.len() != raw.len() {
        auth.token = Some(secrecy::SecretString::from(trimmed.to_owned()));
        auth.token_file = None;
    }
    Ok(())
}

/// Install the ring rustls provider once; tolerate one installed by someone else.
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Err only means another thread installed one first: fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// TCP connector: TCP_NODELAY (no delayed-ACK stall on small writes), any URI scheme (TLS is
/// layered on top), bounded connect time.
fn tcp_connector(opts: &ClientOptions) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    http.set_connect_timeout(Some(opts.connect_timeout));
    http
}

/// The kube client stack: NODELAY connector → rustls (https or plain http) → hyper pool,
/// with the base-URI and auth layers. No kube-level retry: callers retry with [`RetryPolicy`].
fn build_client(config: &kube::Config, opts: &ClientOptions) -> Result<kube::Client, K8sError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(K8sError::Client("no tokio runtime".into()));
    }
    install_crypto_provider();
    let https = config
        .rustls_https_connector_with_connector(tcp_connector(opts))
        .map_err(|e| K8sError::Client(format!("TLS setup: {e}")))?;
    let hyper = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build::<_, kube::client::Body>(https);
    let auth = config
        .auth_layer()
        .map_err(|e| K8sError::Client(format!("credentials: {e}")))?;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn connector_sets_nodelay() {
        use tower::ServiceExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: http::Uri = format!("https://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let io = tcp_connector(&ClientOptions::default())
            .oneshot(uri)
            .await
            .unwrap();
        assert!(io.inner().nodelay().unwrap());
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
