//! From a kubeconfig (or the in-cluster service account) to the thin plugin's
//! [`Http1Transport`]: the server URL, TLS trust and client identity, and the credentials.
//!
//! Supported, as client-go reads them: `server` (with a path prefix), `certificate-authority`
//! (`-data`), `insecure-skip-tls-verify`, `tls-server-name`; users with `token`, `tokenFile`,
//! `client-certificate`/`client-key` (`-data`), `username`/`password`, `exec` credential
//! plugins (non-interactive), and `as`/`as-groups`/`as-uid` impersonation. Refused with a clear
//! reason: `auth-provider` (the legacy gcp/oidc/azure plugins) and `proxy-url`. Exec plugins
//! run in [`super::exec_credential`].

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http::header::{HeaderName, HeaderValue};
use kube::config::{AuthInfo, Cluster, Kubeconfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use secrecy::ExposeSecret;

use super::exec_credential::{run_exec, ExecFailure};
use super::http1::{Endpoint, Http1Transport};

/// Why no transport could be built: a reason that never contains a credential, and whether the
/// next call may succeed unchanged (an `exec` credential plugin that timed out or failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BuildError {
    /// What is wrong.
    pub reason: String,
    /// `true`: the credential source did not answer now; `false`: the kubeconfig is unusable.
    pub transient: bool,
}

impl From<String> for BuildError {
    fn from(reason: String) -> Self {
        BuildError {
            reason,
            transient: false,
        }
    }
}

impl From<ExecFailure> for BuildError {
    fn from(e: ExecFailure) -> Self {
        BuildError {
            reason: e.reason,
            transient: e.transient,
        }
    }
}

impl From<&str> for BuildError {
    fn from(reason: &str) -> Self {
        reason.to_owned().into()
    }
}

/// What the credentials resolve to.
#[derive(Default)]
struct Identity {
    /// `Authorization` header value.
    authorization: Option<String>,
    /// Client certificate chain and key, PEM.
    client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

/// A transport for the current context of `kubeconfig` (already read from its file; relative
/// paths made absolute). Errors are reasons that never contain a credential.
pub(crate) fn transport_from_kubeconfig(
    kubeconfig: &Kubeconfig,
    connect_timeout: Duration,
) -> Result<Http1Transport, BuildError> {
    let context_name = kubeconfig
        .current_context
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or("no current-context")?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| format!("context {context_name:?} not found"))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| format!("cluster {:?} not found", context.cluster))?;
    // client-go accepts a context without a user (anonymous requests).
    let default_user = AuthInfo::default();
    let user = context
        .user
        .as_deref()
        .and_then(|u| kubeconfig.auth_infos.iter().find(|a| a.name == u))
        .and_then(|a| a.auth_info.as_ref())
        .unwrap_or(&default_user);
    build(cluster, user, connect_timeout)
}

fn build(
    cluster: &Cluster,
    user: &AuthInfo,
    connect_timeout: Duration,
) -> Result<Http1Transport, BuildError> {
    if cluster.proxy_url.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err("proxy-url is not supported".into());
    }
    if user.auth_provider.is_some() {
        return Err(
            "auth-provider is not supported: use a token, a tokenFile, a client certificate or \
             an exec credential plugin"
                .into(),
        );
    }
    let server = cluster
        .server
        .as_deref()
        .ok_or("the cluster has no server")?;
    let uri: http::Uri = server
        .parse()
        .map_err(|e| format!("invalid server URL {server:?}: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("server URL {server:?} is neither https:// nor http://").into()),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("server URL {server:?} has no host"))?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let identity = identity(user, cluster)?;
    let tls = if https {
        let name = cluster
            .tls_server_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(&host);
        let name = ServerName::try_from(name.to_owned())
            .map_err(|e| format!("invalid TLS server name {name:?}: {e}"))?;
        Some((Arc::new(tls_config(cluster, &identity)?), name))
    } else {
        None
    };
    let mut headers = vec![(
        http::header::USER_AGENT,
        HeaderValue::from_static(concat!("plexus/", env!("CARGO_PKG_VERSION"))),
    )];
    if let Some(auth) = identity.authorization {
        let mut value = HeaderValue::from_str(&auth)
            .map_err(|_| "the credential is not a valid header value".to_owned())?;
        value.set_sensitive(true);
        headers.push((http::header::AUTHORIZATION, value));
    }
    headers.extend(impersonation(user)?);
    Ok(Http1Transport::new(
        Endpoint {
            host,
            port,
            // Never the URL's user information, which must not travel in a header.
            authority: match authority.port() {
                Some(p) => format!("{}:{}", authority.host(), p.as_str()),
                None => authority.host().to_owned(),
            },
            base_path: uri.path().trim_end_matches('/').to_owned(),
            tls,
        },
        headers,
        connect_timeout,
    ))
}

/// The user's credentials, in client-go's order: a static bearer token (inline, then file) or
/// basic auth, and a client certificate; an `exec` plugin only when none of those is set.
fn identity(user: &AuthInfo, cluster: &Cluster) -> Result<Identity, BuildError> {
    let mut id = Identity::default();
    // client-go treats an empty token as absent.
    let inline = user
        .token
        .as_ref()
        .map(|t| t.expose_secret().trim().to_owned())
        .filter(|t| !t.is_empty());
    if let Some(token) = inline {
        id.authorization = Some(format!("Bearer {token}"));
    } else if let Some(path) = user.token_file.as_deref().filter(|p| !p.is_empty()) {
        let token = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read token file {path}: {e}"))?;
        id.authorization = Some(format!("Bearer {}", token.trim()));
    } else if let (Some(name), Some(password)) = (&user.username, &user.password) {
        let raw = format!("{name}:{}", password.expose_secret());
        id.authorization = Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        ));
    }
    let cert = pem_source(
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_deref(),
        "client-certificate",
    )?;
    let key = pem_source(
        user.client_key_data.as_ref().map(|k| k.expose_secret()),
        user.client_key.as_deref(),
        "client-key",
    )?;
    match (cert, key) {
        (Some(c), Some(k)) => id.client_pem = Some((c, k)),
        (None, None) => {}
        _ => return Err("a client certificate needs both a certificate and a key".into()),
    }
    if let Some(exec) = user
        .exec
        .as_ref()
        .filter(|_| id.authorization.is_none() && id.client_pem.is_none())
    {
        let info = match exec.provide_cluster_info {
            true => Some(cluster_info(cluster)?),
            false => None,
        };
        let cred = run_exec(exec, info)?;
        id.authorization = cred.token.map(|t| format!("Bearer {t}"));
        id.client_pem = cred.client_pem;
    }
    Ok(id)
}

/// Bytes of a `-data` field (base64) or of a file.
fn pem_source(
    data: Option<&str>,
    file: Option<&str>,
    what: &str,
) -> Result<Option<Vec<u8>>, String> {
    if let Some(data) = data.filter(|d| !d.trim().is_empty()) {
        let clean: String = data.split_whitespace().collect();
        return base64::engine::general_purpose::STANDARD
            .decode(clean)
            .map(Some)
            .map_err(|_| format!("{what}-data is not valid base64"));
    }
    match file.filter(|f| !f.is_empty()) {
        Some(path) => std::fs::read(path)
            .map(Some)
            .map_err(|e| format!("cannot read {what} {path}: {e}")),
        None => Ok(None),
    }
}

fn impersonation(user: &AuthInfo) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let value = |v: &str| {
        HeaderValue::from_str(v).map_err(|_| format!("invalid impersonation value {v:?}"))
    };
    let mut out = Vec::new();
    if let Some(u) = user.impersonate.as_deref().filter(|u| !u.is_empty()) {
        out.push((HeaderName::from_static("impersonate-user"), value(u)?));
    }
    if let Some(uid) = user.impersonate_uid.as_deref().filter(|u| !u.is_empty()) {
        out.push((HeaderName::from_static("impersonate-uid"), value(uid)?));
    }
    for g in user.impersonate_groups.iter().flatten() {
        out.push((HeaderName::from_static("impersonate-group"), value(g)?));
    }
    for (key, values) in user.impersonate_user_extra.iter().flatten() {
        let name = HeaderName::from_bytes(format!("impersonate-extra-{key}").as_bytes())
            .map_err(|_| format!("as-user-extra key {key:?} cannot be sent as a header"))?;
        for v in values {
            out.push((name.clone(), value(v)?));
        }
    }
    Ok(out)
}

/// rustls configuration: the cluster's CA (or the system's roots), the client identity, and
/// no verification at all only when the kubeconfig says `insecure-skip-tls-verify`.
fn tls_config(cluster: &Cluster, id: &Identity) -> Result<rustls::ClientConfig, String> {
    super::client::install_crypto_provider();
    let ca = pem_source(
        cluster.certificate_authority_data.as_deref(),
        cluster.certificate_authority.as_deref(),
        "certificate-authority",
    )?;
    let builder = rustls::ClientConfig::builder();
    let insecure = cluster.insecure_skip_tls_verify == Some(true);
    let builder = match ca {
        _ if insecure => {
            tracing::warn!(
                "kubeconfig sets insecure-skip-tls-verify: the API server is not verified"
            );
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification::new()))
        }
        Some(bytes) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(&bytes, "certificate-authority")? {
                roots
                    .add(cert)
                    .map_err(|e| format!("certificate-authority: {e}"))?;
            }
            builder.with_root_certificates(roots)
        }
        None => {
            use rustls_platform_verifier::BuilderVerifierExt;
            builder
                .with_platform_verifier()
                .map_err(|e| format!("system trust store: {e}"))?
        }
    };
    let config = match &id.client_pem {
        Some((cert, key)) => {
            let chain = certificates(cert, "client-certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|_| "client-key holds no PEM private key".to_owned())?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(config)
}

/// Every certificate of a PEM bundle (or one DER certificate).
fn certificates(bytes: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{what}: {e}"))?;
    if !certs.is_empty() {
        return Ok(certs);
    }
    if bytes.first() == Some(&0x30) {
        return Ok(vec![CertificateDer::from(bytes.to_vec())]);
    }
    Err(format!("{what} holds no certificate"))
}

/// `spec.cluster` for a plugin with `provideClusterInfo` (client-go's `Cluster` fields that
/// are set; the CA as data even when the kubeconfig names a file).
fn cluster_info(cluster: &Cluster) -> Result<serde_json::Value, String> {
    let mut info = serde_json::Map::new();
    if let Some(server) = &cluster.server {
        info.insert("server".into(), server.clone().into());
    }
    if let Some(name) = cluster.tls_server_name.as_deref().filter(|n| !n.is_empty()) {
        info.insert("tls-server-name".into(), name.into());
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        info.insert("insecure-skip-tls-verify".into(), true.into());
    }
    let ca = pem_source(
        cluster.certificate_authority_data.as_deref(),
        cluster.certificate_authority.as_deref(),
        "certificate-authority",
    )?;
    if let Some(ca) = ca {
        let data = base64::engine::general_purpose::STANDARD.encode(ca);
        info.insert("certificate-authority-data".into(), data.into());
    }
    Ok(info.into())
}

/// The verifier `insecure-skip-tls-verify: true` asks for: any certificate, signatures still
/// checked with the provider's algorithms.
#[derive(Debug)]
struct NoVerification(rustls::crypto::WebPkiSupportedAlgorithms);

impl NoVerification {
    fn new() -> Self {
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        NoVerification(provider.signature_verification_algorithms)
    }
}

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::config::ExecConfig;

    fn parse(yaml: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(yaml).unwrap()
    }

    fn err(yaml: &str) -> String {
        match transport_from_kubeconfig(&parse(yaml), Duration::from_secs(1)) {
            Ok(_) => panic!("accepted: {yaml}"),
            Err(e) => {
                assert!(!e.transient, "{e:?}");
                e.reason
            }
        }
    }

    const CLUSTER: &str = "clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n";

    #[test]
    fn context_and_cluster_must_exist() {
        assert_eq!(err(CLUSTER), "no current-context");
        let e = err(&format!("{CLUSTER}current-context: x\n"));
        assert!(e.contains("context \"x\" not found"), "{e}");
        let e = err(&format!(
            "{CLUSTER}contexts:\n- name: x\n  context:\n    cluster: other\ncurrent-context: x\n"
        ));
        assert!(e.contains("cluster \"other\" not found"), "{e}");
    }

    #[test]
    fn unsupported_settings_are_named() {
        let ctx =
            "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n";
        let e = err(&format!(
            "{CLUSTER}{ctx}users:\n- name: u\n  user:\n    auth-provider:\n      name: oidc\n"
        ));
        assert!(e.starts_with("auth-provider is not supported"), "{e}");
        let e = err(&format!(
            "clusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\n    proxy-url: http://proxy:3128\n{ctx}"
        ));
        assert_eq!(e, "proxy-url is not supported");
        let e = err(&format!(
            "clusters:\n- name: c\n  cluster:\n    server: ftp://x\n{ctx}"
        ));
        assert!(e.contains("neither https:// nor http://"), "{e}");
    }

    #[test]
    fn bad_credentials_never_echo_the_secret() {
        let ctx =
            "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n";
        let e = err(&format!(
            "{CLUSTER}{ctx}users:\n- name: u\n  user:\n    token: \"s3cr3t\\nX\"\n"
        ));
        assert!(!e.contains("s3cr3t"), "{e}");
        let e = err(&format!(
            "{CLUSTER}{ctx}users:\n- name: u\n  user:\n    client-key-data: \"s3cr3t!!\"\n"
        ));
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    fn user(yaml_user: &str, server: &str) -> Kubeconfig {
        parse(&format!(
            "clusters:\n- name: c\n  cluster:\n    server: {server}\n\
             users:\n- name: u\n  user:\n{yaml_user}\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ))
    }

    fn auth_of(kc: &Kubeconfig) -> Result<Option<String>, String> {
        let ctx = &kc.contexts[0].context.as_ref().unwrap();
        let user = kc
            .auth_infos
            .iter()
            .find(|a| Some(&a.name) == ctx.user.as_ref())
            .and_then(|a| a.auth_info.clone())
            .unwrap_or_default();
        identity(&user, kc.clusters[0].cluster.as_ref().unwrap())
            .map(|id| id.authorization)
            .map_err(|e| e.reason)
    }

    #[test]
    fn credentials_follow_client_go_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let f = file.display();
        // An empty inline token is absent: the token file is used.
        let kc = user(
            &format!("    token: \"\"\n    tokenFile: {f}\n"),
            "http://h",
        );
        assert_eq!(auth_of(&kc).unwrap().as_deref(), Some("Bearer from-file"));
        // A static token wins over an exec plugin, which is not even run.
        let kc = user(
            "    token: static\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /nonexistent/plugin\n",
            "http://h",
        );
        assert_eq!(auth_of(&kc).unwrap().as_deref(), Some("Bearer static"));
        // Without one, the plugin runs (and its failure is the error).
        let kc = user(
            "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /nonexistent/plugin\n",
            "http://h",
        );
        assert!(auth_of(&kc).unwrap_err().contains("/nonexistent/plugin"));
    }

    #[test]
    fn the_host_header_never_carries_user_information() {
        let kc = user(
            "    token: t\n",
            "https://someone:pw@api.example:6443/prefix/",
        );
        let t = transport_from_kubeconfig(&kc, Duration::from_secs(1)).unwrap();
        let ep = t.endpoint();
        assert_eq!(ep.authority, "api.example:6443");
        assert_eq!((ep.host.as_str(), ep.port), ("api.example", 6443));
        assert_eq!(ep.base_path, "/prefix");
        let kc = user("    token: t\n", "https://[fd00::1]");
        let t = transport_from_kubeconfig(&kc, Duration::from_secs(1)).unwrap();
        let ep = t.endpoint();
        assert_eq!(
            (ep.authority.as_str(), ep.host.as_str(), ep.port),
            ("[fd00::1]", "fd00::1", 443)
        );
    }

    #[test]
    fn exec_plugin_token_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("cred.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\necho \"$KUBERNETES_EXEC_INFO\" > \"$0.info\"\n\
             printf '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}' \"$TOKEN_VALUE-$1\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
        let user = AuthInfo {
            exec: Some(ExecConfig {
                api_version: Some("client.authentication.k8s.io/v1".into()),
                command: Some(script.display().to_string()),
                args: Some(vec!["arg1".into()]),
                env: Some(vec![[
                    ("name".to_owned(), "TOKEN_VALUE".to_owned()),
                    ("value".to_owned(), "tok".to_owned()),
                ]
                .into()]),
                drop_env: None,
                install_hint: None,
                interactive_mode: None,
                provide_cluster_info: false,
                cluster: None,
                other: Default::default(),
            }),
            ..AuthInfo::default()
        };
        let id = identity(&user, &Cluster::default()).unwrap();
        assert_eq!(id.authorization.as_deref(), Some("Bearer tok-arg1"));
        let info = std::fs::read_to_string(format!("{}.info", script.display())).unwrap();
        let info: serde_json::Value = serde_json::from_str(&info).unwrap();
        assert_eq!(info["kind"], "ExecCredential");
        assert_eq!(info["spec"]["interactive"], false);

        // A failing plugin: its status and first stderr line, never its stdout.
        std::fs::write(
            &script,
            "#!/bin/sh\necho tok-on-stdout\necho nope >&2\nexit 3\n",
        )
        .unwrap();
        let e = identity(&user, &Cluster::default()).err().unwrap();
        assert!(
            e.reason.contains("failed") && e.reason.contains("nope"),
            "{e:?}"
        );
        assert!(!e.reason.contains("tok-on-stdout"), "{e:?}");
        // It may work on the next call (its token service was down): transient.
        assert!(e.transient, "{e:?}");

        // No credential in its output, or no such program: the kubeconfig is wrong.
        std::fs::write(
            &script,
            "#!/bin/sh
echo '{\"status\":{}}'\n",
        )
        .unwrap();
        let e = identity(&user, &Cluster::default()).err().unwrap();
        assert!(!e.transient && e.reason.contains("neither"), "{e:?}");
        let mut missing = user.clone();
        if let Some(x) = missing.exec.as_mut() {
            x.command = Some(dir.path().join("nowhere").display().to_string());
        }
        let e = identity(&missing, &Cluster::default()).err().unwrap();
        assert!(!e.transient, "{e:?}");
    }
}
