//! An honest in-memory Kubernetes API server for tests: real paths, real `Status` errors and
//! codes, resourceVersion conflicts, bearer-token auth, down/up on demand and a request log.
//! Faults in front of the real apiserver (latency, HTTP errors, dropped connections) are
//! [`crate::realk8s::fault_proxy`]'s.
//!
//! It runs on its own thread with its own tokio runtime, so plain `#[test]` functions and
//! `#[tokio::test]` functions can both use it, and separate processes can reach it over HTTP.
//!
//! ```
//! use plexus_e2e::{Access, TestApiServer, TestApiServerOptions};
//! use serde_json::json;
//!
//! let srv = TestApiServer::start(TestApiServerOptions::default()).unwrap();
//! srv.add_token("t0k3n", Access::Full);
//! srv.put_nad("default", "macvlan1", r#"{"cniVersion":"1.0.0","type":"macvlan"}"#, &[]).unwrap();
//! srv.put_pod(json!({
//!     "metadata": {"name": "web", "namespace": "default",
//!                  "annotations": {"k8s.v1.cni.cncf.io/networks": "macvlan1"}},
//!     "spec": {"containers": [{"name": "c", "image": "busybox"}]}
//! })).unwrap();
//! let dir = tempfile::tempdir().unwrap();
//! srv.write_kubeconfig(&dir.path().join("kubeconfig"), "t0k3n").unwrap();
//! // ... run plexus with that kubeconfig, then inspect:
//! assert_eq!(srv.count_requests("PATCH", "/api/v1/namespaces/default/pods/web/status"), 0);
//! assert!(srv.get_pod("default", "web").is_some());
//! ```

mod admin;
mod auth;
mod discovery;
mod handlers;
pub(crate) mod kubeconfig;
mod log;
mod patch;
mod resources;
mod routes;
mod seed;
mod select;
mod server;
mod status;
mod store;
#[cfg(test)]
mod tests;
mod tls;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The fault proxy's request matcher (re-exported where the stand-in used to have it).
pub use crate::realk8s::fault_rules::RequestMatcher;
pub use auth::Access;
pub use log::RequestRecord;
pub use resources::Resource;

use server::{lock, Shared};

/// Errors from starting, controlling or seeding the test API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// Binding the listen address failed.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Starting the server thread or runtime failed.
    #[error("start server runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A seed file is not valid JSON.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// Generating the certificate or TLS configuration failed.
    #[error("TLS setup: {0}")]
    Tls(#[from] tls::TlsError),
    /// A seeded object is not acceptable (unknown kind, missing or invalid name).
    #[error("invalid object: {0}")]
    InvalidObject(String),
}

/// Options for [`TestApiServer::start`].
#[derive(Clone)]
pub struct TestApiServerOptions {
    /// Address to listen on; port 0 picks an ephemeral port.
    pub listen: SocketAddr,
    /// Token for the `/_test/...` admin endpoints; `None` disables them.
    pub admin_token: Option<String>,
    /// Serve HTTPS with a freshly generated CA (see [`TestApiServer::ca_pem`]).
    pub tls: bool,
}

impl Default for TestApiServerOptions {
    fn default() -> Self {
        TestApiServerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_token: None,
            tls: false,
        }
    }
}

impl std::fmt::Debug for TestApiServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApiServerOptions")
            .field("listen", &self.listen)
            .field(
                "admin_token",
                &self.admin_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// A running test API server. Dropping it stops the server.
pub struct TestApiServer {
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// A random 32 hex digit token.
pub fn generate_token() -> String {
    let mut s = store::Store::default();
    s.new_uid().replace('-', "")
}

impl TestApiServer {
    /// Binds `opts.listen` and starts serving on a background thread with its own runtime.
    pub fn start(opts: TestApiServerOptions) -> Result<TestApiServer, ApiServerError> {
        let listener =
            std::net::TcpListener::bind(opts.listen).map_err(|source| ApiServerError::Bind {
                addr: opts.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(ApiServerError::Runtime)?;
        let tls = if opts.tls {
            Some(tls::generate(addr.ip())?)
        } else {
            None
        };
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("plexus-test-apiserver".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
            })
            .map_err(ApiServerError::Runtime)?;
        let handle = handle_rx
            .recv()
            .map_err(|_| ApiServerError::Runtime(std::io::Error::other("server thread exited")))?
            .map_err(ApiServerError::Runtime)?;
        let shared = Arc::new(Shared::new(addr, handle, opts.admin_token, tls));
        let server = TestApiServer {
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        server
            .shared
            .listen(listener)
            .map_err(ApiServerError::Runtime)?;
        tracing::info!(%addr, "test API server listening");
        Ok(server)
    }

    /// The bound address (the same across [`down`](Self::down)/[`up`](Self::up)).
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:<port>` (`https://` when serving TLS).
    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// PEM of the CA that signed the server certificate, when serving TLS.
    pub fn ca_pem(&self) -> Option<String> {
        self.shared.tls.as_ref().map(|t| t.ca_pem.clone())
    }

    /// Writes a kubeconfig (mode 0600) pointing at this server with `token`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<(), ApiServerError> {
        kubeconfig::write(path, &self.url(), self.ca_pem().as_deref(), token).map_err(|source| {
            ApiServerError::Io {
                path: path.to_path_buf(),
                source,
            }
        })
    }

    /// The kubeconfig text [`write_kubeconfig`](Self::write_kubeconfig) writes.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        kubeconfig::render(&self.url(), self.ca_pem().as_deref(), token)
    }

    /// Registers `token` for user `test-user` with `access`.
    pub fn add_token(&self, token: &str, access: Access) {
        self.add_token_for(token, "test-user", access);
    }

    /// Registers `token` for `user` with `access`.
    pub fn add_token_for(&self, token: &str, user: &str, access: Access) {
        lock(&self.shared.tokens).add(token, user, access);
    }

    /// Unregisters `token`.
    pub fn remove_token(&self, token: &str) {
        lock(&self.shared.tokens).remove(token);
    }

    /// All recorded API requests, oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).all()
    }

    /// Forgets recorded requests.
    pub fn clear_requests(&self) {
        lock(&self.shared.log).clear();
    }

    /// Recorded requests with `method` whose path starts with `path_prefix`.
    pub fn count_requests(&self, method: &str, path_prefix: &str) -> usize {
        lock(&self.shared.log).count(method, path_prefix)
    }

    /// Waits until at least `n` recorded requests have `method` and a path starting with
    /// `path_prefix`; returns whether that happened within `timeout`.
    pub fn wait_for_requests(
        &self,
        method: &str,
        path_prefix: &str,
        n: usize,
        timeout: Duration,
    ) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.count_requests(method, path_prefix) >= n {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Closes the listener and drops open connections: clients get connection refused.
    pub fn down(&self) {
        self.shared.down();
    }

    /// Listens again on the same address.
    pub fn up(&self) -> Result<(), ApiServerError> {
        self.shared.up().map_err(|source| ApiServerError::Bind {
            addr: self.shared.addr,
            source,
        })
    }

    /// Whether the listener is open.
    pub fn is_up(&self) -> bool {
        self.shared.is_up()
    }

    /// Stops the server and its thread (also done on drop).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.down();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
