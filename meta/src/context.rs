//! Per-call context: the parsed plexus config, the delegate runtime, the plan store, the
//! Kubernetes client (built lazily, only when a verb needs the API; handed in by the daemon)
//! and where async work runs (a runtime of the call's own, or the daemon's shared one).

use crate::error::MetaError;
use crate::k8s::{ClientOptions, InClusterEnv, KubeClient, RetryPolicy};
use crate::state::PlanStore;
use plexus_conf::plexus_config::PlexusConfig;
use plexus_delegates::cache::ResultCache;
use plexus_delegates::skel::CmdArgs;
use plexus_delegates::Runtime;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the API lives, as configured.
#[derive(Debug, Clone)]
pub enum ApiSource {
    /// A kubeconfig file.
    Kubeconfig(PathBuf),
    /// The in-cluster service account.
    InCluster(InClusterEnv),
    /// No API: static mode.
    None,
}

/// Everything a verb needs.
pub struct Ctx {
    /// The plexus config.
    pub config: PlexusConfig,
    /// Delegate runtime (search path: `binDir` then `CNI_PATH`).
    pub runtime: Runtime,
    /// Saved plans and locks.
    pub store: PlanStore,
    /// API source.
    pub api: ApiSource,
    exec: Exec,
    /// The client once built (or handed in): `Some(None)` means static mode.
    client: Option<Option<KubeClient>>,
}

/// Where async work runs.
enum Exec {
    /// A single-threaded runtime of this call's own, started on first use (thin mode).
    Own(Option<tokio::runtime::Runtime>),
    /// The daemon's runtime: futures are driven from a worker thread through its handle, and
    /// follow-up work (retries, events) can outlive the call.
    Shared(tokio::runtime::Handle),
}

impl Ctx {
    /// Build from the call. `in_cluster` is the process's in-cluster env, if any.
    pub fn new(args: &CmdArgs, in_cluster: Option<InClusterEnv>) -> Result<Self, MetaError> {
        let config = PlexusConfig::parse(&args.stdin).map_err(|source| MetaError::Config {
            source: source.into(),
        })?;
        Ok(Self::from_config(config, &args.path, in_cluster))
    }

    /// Build from a parsed config and `CNI_PATH` (`plexus explain` has no CNI call).
    pub fn from_config(
        config: PlexusConfig,
        cni_path: &[PathBuf],
        in_cluster: Option<InClusterEnv>,
    ) -> Self {
        let mut search_path = Vec::new();
        if !config.bin_dir.is_empty() {
            search_path.push(PathBuf::from(&config.bin_dir));
        }
        search_path.extend(cni_path.iter().cloned());
        let cni_dir = PathBuf::from(&config.cni_dir);
        let runtime = Runtime {
            search_path,
            timeout: Duration::from_secs(config.delegate_timeout_seconds),
            cache: Some(ResultCache::new(&cni_dir)),
        };
        let api = if !config.kubeconfig.is_empty() {
            ApiSource::Kubeconfig(PathBuf::from(&config.kubeconfig))
        } else if let Some(env) = in_cluster {
            ApiSource::InCluster(env)
        } else {
            ApiSource::None
        };
        Ctx {
            store: PlanStore::new(&cni_dir),
            config,
            runtime,
            api,
            exec: Exec::Own(None),
            client: None,
        }
    }

    /// Run async work on the daemon's runtime and use its long-lived client (`None`: static
    /// mode) instead of building one per call.
    pub fn with_shared(
        mut self,
        handle: tokio::runtime::Handle,
        client: Option<KubeClient>,
    ) -> Self {
        self.exec = Exec::Shared(handle);
        self.client = Some(client);
        self
    }

    /// Run `f` in the background when this call runs inside the daemon (it may outlive the
    /// call); `false` (nothing spawned) in thin mode, where the process ends with the call.
    pub fn spawn_detached<F>(&self, f: F) -> bool
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.exec {
            Exec::Shared(h) => {
                h.spawn(f);
                true
            }
            Exec::Own(_) => false,
        }
    }

    /// True inside the daemon (work may continue in the background after the call returns).
    pub fn in_daemon(&self) -> bool {
        matches!(self.exec, Exec::Shared(_))
    }

    /// Run `f` now (thin mode) or in the background on the daemon's runtime.
    pub fn run_or_spawn<F>(&mut self, f: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match &self.exec {
            Exec::Shared(h) => {
                h.spawn(f);
            }
            Exec::Own(_) => {
                let _ = self.block_on(f);
            }
        }
    }

    /// True when an API server is configured.
    pub fn has_api(&self) -> bool {
        !matches!(self.api, ApiSource::None)
    }

    /// Run a future on this call's single-threaded runtime.
    pub fn block_on<F: std::future::Future>(&mut self, f: F) -> Result<F::Output, MetaError> {
        match &mut self.exec {
            Exec::Shared(h) => Ok(h.block_on(f)),
            Exec::Own(rt) => {
                if rt.is_none() {
                    let built = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|source| MetaError::Runtime { source })?;
                    *rt = Some(built);
                }
                Ok(rt.as_ref().expect("runtime just set").block_on(f))
            }
        }
    }

    /// The Kubernetes client (`None` in static mode), built on first use.
    pub fn client(&mut self) -> Result<Option<KubeClient>, MetaError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let built = self.build_client()?;
        self.client = Some(built.clone());
        Ok(built)
    }

    fn build_client(&mut self) -> Result<Option<KubeClient>, MetaError> {
        let _phase = plexus_delegates::timing::phase("client_build");
        let opts = ClientOptions {
            retry: RetryPolicy {
                total: Duration::from_millis(self.config.pod_timeout_ms),
                interval: Duration::from_millis(250),
            },
            ..ClientOptions::for_node(&self.config.node_name)
        };
        let api = self.api.clone();
        let built = self.block_on(async move {
            match &api {
                ApiSource::Kubeconfig(p) => {
                    KubeClient::from_settings(Some(p.as_path()), None, opts).await
                }
                ApiSource::InCluster(env) => KubeClient::from_settings(None, Some(env), opts).await,
                ApiSource::None => Ok(None),
            }
        })?;
        built.map_err(|source| MetaError::KubeClient {
            source: source.into(),
        })
    }

    /// `confDir` as a path.
    pub fn conf_dir(&self) -> &Path {
        Path::new(&self.config.conf_dir)
    }
}

/// Wait for the readiness indicator file (ADD), up to the configured time.
pub fn wait_ready(config: &PlexusConfig) -> Result<(), MetaError> {
    if config.readiness_indicator_file.is_empty() {
        return Ok(());
    }
    let path = Path::new(&config.readiness_indicator_file);
    // Parsing bounds the value; clamped again so a config built in code cannot overflow.
    let max = plexus_conf::bounds::READINESS_TIMEOUT_SECONDS.1;
    let deadline =
        std::time::Instant::now() + Duration::from_secs(config.readiness_timeout_seconds.min(max));
    loop {
        if path.exists() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(MetaError::NotReady {
                file: path.to_path_buf(),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
