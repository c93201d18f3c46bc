//! The daemon's transport: a `kube::Client` (hyper's pool over a TCP_NODELAY connector and
//! rustls), which the daemon needs for its watches and which re-reads rotated token files and
//! CA bundles, as a long-running process must.

use std::path::Path;

use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use tower::{BoxError, ServiceBuilder};

use super::client::{
    install_crypto_provider, read_kubeconfig, redact, ClientOptions, InClusterEnv, KubeClient,
};
use super::error::chain as error_chain;
use super::error::K8sError;
use super::http1::MAX_BODY;
use super::transport::{Request, SendFuture, Transport, TransportError};

/// [`Transport`] over a `kube::Client`.
struct KubeTransport(kube::Client);

impl Transport for KubeTransport {
    fn send(&self, req: Request) -> SendFuture<'_> {
        Box::pin(async move {
            let answer = self
                .0
                .send(req.map(kube::client::Body::from))
                .await
                .map_err(classify)?;
            let (parts, body) = answer.into_parts();
            let bytes = http_body_util::Limited::new(body, MAX_BODY)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        TransportError::Other(format!("answer body over {MAX_BODY} bytes"))
                    } else {
                        TransportError::Unreachable(format!("reading the answer: {e}"))
                    }
                })?
                .to_bytes();
            Ok(http::Response::from_parts(parts, bytes.to_vec()))
        })
    }

    fn kube_client(&self) -> Option<kube::Client> {
        Some(self.0.clone())
    }
}

/// A `kube::Error` from sending: no complete answer (transport) or something else.
fn classify(err: kube::Error) -> TransportError {
    match err {
        kube::Error::HyperError(e) => TransportError::Unreachable(error_chain(&e)),
        kube::Error::Service(e) if is_transport_error(e.as_ref()) => {
            TransportError::Unreachable(error_chain(e.as_ref()))
        }
        other => TransportError::Other(error_chain(&other)),
    }
}

/// True if `err` (or anything in its source chain) is a hyper-util client error or an I/O error:
/// both mean the request did not get a complete HTTP answer.
fn is_transport_error(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<hyper_util::client::legacy::Error>() || e.is::<std::io::Error>() {
            return true;
        }
        cur = e.source();
    }
    false
}

impl KubeClient {
    /// Wrap an existing `kube::Client` (the daemon's, or a test's).
    pub fn from_client(client: kube::Client, opts: ClientOptions) -> Self {
        KubeClient::with_transport(std::sync::Arc::new(KubeTransport(client)), opts)
    }

    /// Like [`KubeClient::from_settings`], over a `kube::Client` (see
    /// [`KubeClient::kube_client`]): for the daemon. Must run inside a tokio runtime.
    pub async fn from_settings_with_kube(
        kubeconfig: Option<&Path>,
        in_cluster: Option<&InClusterEnv>,
        opts: ClientOptions,
    ) -> Result<Option<Self>, K8sError> {
        let (kubeconfig, err): (Kubeconfig, Box<dyn Fn(String) -> K8sError>) =
            match (kubeconfig.filter(|p| !p.as_os_str().is_empty()), in_cluster) {
                (Some(path), _) => {
                    let owned = path.to_owned();
                    let kc_err = move |reason| K8sError::Kubeconfig {
                        path: owned.clone(),
                        reason,
                    };
                    (read_kubeconfig(path)?, Box::new(kc_err))
                }
                (None, Some(env)) => (env.kubeconfig()?, Box::new(K8sError::InCluster)),
                (None, None) => return Ok(None),
            };
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(redact(&e)))?;
        trim_token_file(&mut config.auth_info).map_err(&err)?;
        let client = build_client(&config, &opts).map_err(|e| match e {
            K8sError::Client(reason) => err(reason),
            other => other,
        })?;
        Ok(Some(KubeClient::from_client(client, opts)))
    }
}

/// kube sends a token file's contents verbatim, so a trailing newline (`echo tok > file`) makes
/// an invalid header. When the file has surrounding whitespace, read it once and use the trimmed
/// token inline; otherwise leave it to kube, which re-reads rotated tokens.
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
/// with the base-URI and auth layers. No kube-level retry: callers retry with
/// [`RetryPolicy`](super::RetryPolicy).
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
    use super::super::error::Ctx;
    use super::super::testutil::{json_response, MockApi};
    use super::super::RetryPolicy;
    use super::*;

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
    fn io_errors_in_the_service_chain_are_unreachable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = classify(kube::Error::Service(Box::new(io)));
        assert!(
            matches!(e, TransportError::Unreachable(ref m) if m.contains("refused")),
            "{e:?}"
        );
        let plain: BoxError = "auth plugin failed".into();
        let e = classify(kube::Error::Service(plain));
        assert!(matches!(e, TransportError::Other(_)), "{e:?}");
    }

    /// The same requests and answers through a `kube::Client` as through the thin transport.
    #[tokio::test]
    async fn requests_and_answers_through_kube() {
        let mock = MockApi::new(vec![
            json_response(
                200,
                r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p1","namespace":"ns1","uid":"u1"}}"#,
            ),
            json_response(
                403,
                r#"{"kind":"Status","reason":"Forbidden","message":"no","code":403}"#,
            ),
        ]);
        let client = KubeClient::from_client(
            kube::Client::new(mock.clone(), "default"),
            ClientOptions::default(),
        );
        assert!(client.kube_client().is_some());
        let pod = client
            .get_pod("ns1", "p1", Some("u1"), RetryPolicy::none())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("u1"));
        let ctx = Ctx {
            what: "get pod",
            ns: "ns1",
            name: "p2",
        };
        let req = http::Request::get("/api/v1/namespaces/ns1/pods/p2")
            .body(Vec::new())
            .unwrap();
        match client.exchange(ctx, req).await {
            Err(K8sError::Api { code, reason, .. }) => {
                assert_eq!((code, reason.as_str()), (403, "Forbidden"))
            }
            other => panic!("{other:?}"),
        }
        let paths: Vec<_> = mock
            .requests()
            .into_iter()
            .map(|r| r.path_and_query)
            .collect();
        assert_eq!(
            paths,
            [
                "/api/v1/namespaces/ns1/pods/p1",
                "/api/v1/namespaces/ns1/pods/p2"
            ]
        );
    }
}
