//! Per-call context: the parsed plexus config, the delegate runtime, the plan store, and the
//! Kubernetes client (built lazily, only when a verb needs the API).

use crate::k8s::{ClientOptions, InClusterEnv, KubeClient, RetryPolicy};
use crate::state::PlanStore;
use plexus_conf::error::{code, CniError};
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
    tokio: Option<tokio::runtime::Runtime>,
}

impl Ctx {
    /// Build from the call. `in_cluster` is the process's in-cluster env, if any.
    pub fn new(args: &CmdArgs, in_cluster: Option<InClusterEnv>) -> Result<Self, CniError> {
        let config = PlexusConfig::parse(&args.stdin)?;
        let mut search_path = Vec::new();
        if !config.bin_dir.is_empty() {
            search_path.push(PathBuf::from(&config.bin_dir));
        }
        search_path.extend(args.path.iter().cloned());
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
        Ok(Ctx {
            store: PlanStore::new(&cni_dir),
            config,
            runtime,
            api,
            tokio: None,
        })
    }

    /// True when an API server is configured.
    pub fn has_api(&self) -> bool {
        !matches!(self.api, ApiSource::None)
    }

    /// Run a future on this call's single-threaded runtime.
    pub fn block_on<F: std::future::Future>(&mut self, f: F) -> Result<F::Output, CniError> {
        if self.tokio.is_none() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| {
                    CniError::internal("failed to start the async runtime", e.to_string())
                })?;
            self.tokio = Some(rt);
        }
        Ok(self.tokio.as_ref().expect("runtime just set").block_on(f))
    }

    /// Build the Kubernetes client (`None` in static mode).
    pub fn client(&mut self) -> Result<Option<KubeClient>, CniError> {
        let opts = ClientOptions {
            retry: RetryPolicy {
                total: Duration::from_millis(self.config.pod_timeout_ms),
                interval: Duration::from_millis(250),
            },
            ..ClientOptions::default()
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
        built.map_err(|e| {
            CniError::new(
                e.cni_code(),
                "cannot build the Kubernetes client",
                e.to_string(),
            )
        })
    }

    /// `confDir` as a path.
    pub fn conf_dir(&self) -> &Path {
        Path::new(&self.config.conf_dir)
    }
}

/// Wait for the readiness indicator file (ADD), up to the configured time.
pub fn wait_ready(config: &PlexusConfig) -> Result<(), CniError> {
    if config.readiness_indicator_file.is_empty() {
        return Ok(());
    }
    let path = Path::new(&config.readiness_indicator_file);
    let deadline =
        std::time::Instant::now() + Duration::from_secs(config.readiness_timeout_seconds);
    loop {
        if path.exists() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(CniError::new(
                code::TRY_AGAIN_LATER,
                "the default network is not ready",
                format!("readiness indicator file {} does not exist", path.display()),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
