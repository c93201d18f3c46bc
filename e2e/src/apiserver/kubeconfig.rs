//! Writing a kubeconfig that points a client at the test API server with a bearer token.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Name used for the cluster, user and context entries.
pub const CONTEXT_NAME: &str = "plexus-test";

/// JSON string quoting is valid YAML double-quoted scalar syntax.
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// Kubeconfig YAML text for `server_url`, an optional CA (PEM) and `token`.
pub fn render(server_url: &str, ca_pem: Option<&str>, token: &str) -> String {
    use base64::Engine as _;
    let ca = ca_pem
        .map(|pem| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
            format!("    certificate-authority-data: {}\n", quote(&b64))
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {n}\n  cluster:\n    server: {server}\n{ca}\
         users:\n\
         - name: {n}\n  user:\n    token: {token}\n\
         contexts:\n\
         - name: {n}\n  context:\n    cluster: {n}\n    user: {n}\n\
         current-context: {n}\n",
        n = CONTEXT_NAME,
        server = quote(server_url),
        token = quote(token),
    )
}

/// Writes the kubeconfig to `path` with mode 0600 (also when the file already existed).
pub fn write(
    path: &Path,
    server_url: &str,
    ca_pem: Option<&str>,
    token: &str,
) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(render(server_url, ca_pem, token).as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_0600_file_with_server_and_token() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("kubeconfig");
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&p, "http://127.0.0.1:1", None, "t\"ok").unwrap();
        let meta = std::fs::metadata(&p).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("server: \"http://127.0.0.1:1\""), "{text}");
        assert!(text.contains("token: \"t\\\"ok\""), "{text}");
        assert!(text.contains("current-context: plexus-test"), "{text}");
    }
}
