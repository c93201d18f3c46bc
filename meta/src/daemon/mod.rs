//! `plexus daemon`: the node daemon of daemon mode. It keeps watch caches of the node's pods
//! and the NADs ([`cache`]), serves CNI calls forwarded by the shim over a Unix socket with an
//! explicit concurrency limit and bounded queue ([`server`]), runs the same pipeline as thin
//! mode with its inputs read from the caches ([`cache::CacheInputs`]), and exports metrics,
//! `/healthz` and `/readyz` ([`metrics`]). SIGTERM drains: the socket disappears (shims fall
//! back, see [`crate::shim`]) and the calls already accepted finish.

pub mod cache;
pub mod cri;
pub mod metrics;
pub mod metrics_http;
pub mod protocol;
pub mod reconcile;
pub mod reconcile_run;
pub mod server;
/// The background network-status writer (in the report stage; kept under this name).
pub use crate::report::background as status;

use crate::context::Ctx;
use crate::k8s::{ClientOptions, InClusterEnv, KubeClient, RetryPolicy};
use crate::verbs::{add, check, del};
use cache::{CacheInputs, Caches};
use metrics::Metrics;
use plexus_conf::error::CniError;
use plexus_delegates::skel::{self, AddOutput, CmdArgs, Plugin};
use protocol::{Request, Response};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Default socket path (the shim config's `daemonSocket`).
pub const DEFAULT_SOCKET: &str = "/run/plexus/plexus.sock";

/// The daemon's settings (`--config FILE`, JSON; flags override).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct DaemonConfig {
    /// The CNI socket; its directory is made private (0700) to the daemon.
    pub socket_path: String,
    /// A kubeconfig; empty: the in-cluster service account, else no API (static mode).
    pub kubeconfig: String,
    /// This node (pods are watched with `spec.nodeName=<node>`); default `$PLEXUS_NODE_NAME`.
    pub node_name: String,
    /// CNI calls served at once.
    pub max_concurrent: usize,
    /// Accepted calls waiting for a worker; beyond it a call is refused with code 11.
    pub queue_size: usize,
    /// How long a pod missing from the synced cache is waited for before one GET, ms.
    pub pod_wait_ms: u64,
    /// `host:port` for `/metrics`, `/healthz`, `/readyz`; empty: off.
    pub metrics_address: String,
    /// HTTPS certificate, or plain HTTP on loopback (`metricsInsecureHttp`, `metricsCertFile`,
    /// `metricsKeyFile`; [`metrics_http::Serving`]).
    #[serde(flatten)]
    pub metrics_serving: metrics_http::Serving,
    /// A file written once the caches are synced (removed at shutdown); empty: none.
    pub readiness_file: String,
    /// How long SIGTERM waits for accepted calls to finish, seconds.
    pub drain_seconds: u64,
    /// Total time budget for one API read (pod GET on a cache miss), ms.
    pub api_timeout_ms: u64,
    /// The daemon's log level; empty: `$PLEXUS_LOG_LEVEL`, else `info`.
    pub log_level: String,
    /// `text` or `json` (one object per line); `$PLEXUS_LOG_FORMAT` wins.
    pub log_format: String,
    /// A log file (appended, 0600, rotated at 100 MB, 5 kept) besides stderr; empty: stderr
    /// only. The CNI config's `logFile` is the shim's and the in-process fallbacks' log.
    pub log_file: String,
    /// Write the network-status inside the ADD (thin mode's semantics: a permanent refusal
    /// undoes the ADD) instead of right after its answer ([`status`]).
    pub status_in_call: bool,
    /// The host's `/` as mounted in the daemon's container (`/hostroot`); delegates are exec'd
    /// chrooted into it, so they see the host's files (docs/daemon.md). Empty: no chroot.
    pub host_root: String,
    /// How often the node reconciler runs ([`reconcile`]), seconds; 0: never.
    pub reconcile_interval_seconds: u64,
    /// A plexus CNI config the reconciler covers besides the configs of the calls served;
    /// empty: `/etc/cni/net.d/00-plexus.conflist` or `.conf`, when there is one.
    pub cni_config: String,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            socket_path: DEFAULT_SOCKET.into(),
            kubeconfig: String::new(),
            node_name: std::env::var("PLEXUS_NODE_NAME").unwrap_or_default(),
            max_concurrent: 8,
            queue_size: 512,
            pod_wait_ms: 1000,
            metrics_address: String::new(),
            metrics_serving: metrics_http::Serving::default(),
            readiness_file: String::new(),
            drain_seconds: 30,
            api_timeout_ms: 2500,
            log_level: String::new(),
            log_format: String::new(),
            log_file: String::new(),
            status_in_call: false,
            host_root: String::new(),
            reconcile_interval_seconds: 60,
            cni_config: String::new(),
        }
    }
}

/// Bounds of the daemon's numeric settings (docs/limits.md).
const MAX_CONCURRENT: (u64, u64) = (1, 1024);
const QUEUE_SIZE: (u64, u64) = (0, 65_536);
const POD_WAIT_MS: (u64, u64) = (0, 600_000);
const DRAIN_SECONDS: (u64, u64) = (0, 3600);
const API_TIMEOUT_MS: (u64, u64) = (100, 600_000);
const RECONCILE_INTERVAL_SECONDS: (u64, u64) = (0, 86_400);

const USAGE: &str =
    "usage: plexus daemon [--config FILE] [--socket PATH] [--kubeconfig FILE] [--node NAME]
                     [--max-concurrent N] [--queue-size N] [--pod-wait-ms N]
                     [--metrics-address HOST:PORT] [--metrics-insecure-http]
                     [--metrics-cert-file PEM --metrics-key-file PEM]
                     [--readiness-file PATH] [--drain-seconds N]
                     [--log-level LEVEL] [--log-format text|json] [--log-file PATH] [--status-in-call]
                     [--host-root DIR] [--reconcile-interval SECONDS] [--cni-config FILE]
       plexus daemon reconcile --config FILE ... [--every SECONDS]
                     (node reconciler: one pass, or a loop; --help)
       plexus-daemon --version";

impl DaemonConfig {
    /// From the command line (a `--config` file first, then the flags).
    pub fn from_args(argv: &[String]) -> Result<DaemonConfig, String> {
        let mut cfg = DaemonConfig::default();
        if let Some(i) = argv.iter().position(|a| a == "--config") {
            let path = argv.get(i + 1).ok_or("--config wants a file")?;
            let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
            cfg = serde_json::from_slice(&bytes).map_err(|e| format!("{path}: {e}"))?;
        }
        let mut it = argv.iter();
        while let Some(a) = it.next() {
            let mut val = || it.next().cloned().ok_or(format!("{a} wants a value"));
            let num = |v: String| v.parse::<u64>().map_err(|e| format!("{a}: {e}"));
            match a.as_str() {
                "--config" => {
                    val()?;
                }
                "--socket" => cfg.socket_path = val()?,
                "--kubeconfig" => cfg.kubeconfig = val()?,
                "--node" => cfg.node_name = val()?,
                "--max-concurrent" => cfg.max_concurrent = num(val()?)? as usize,
                "--queue-size" => cfg.queue_size = num(val()?)? as usize,
                "--pod-wait-ms" => cfg.pod_wait_ms = num(val()?)?,
                "--metrics-address" => cfg.metrics_address = val()?,
                "--readiness-file" => cfg.readiness_file = val()?,
                "--drain-seconds" => cfg.drain_seconds = num(val()?)?,
                "--log-level" => cfg.log_level = val()?,
                "--log-file" => cfg.log_file = val()?,
                "--log-format" => {
                    cfg.log_format = val()?;
                    if plexus_delegates::logging::Format::parse(&cfg.log_format).is_none() {
                        return Err(format!("--log-format {:?}: text or json", cfg.log_format));
                    }
                }
                "--status-in-call" => cfg.status_in_call = true,
                "--host-root" => cfg.host_root = val()?,
                "--reconcile-interval" => cfg.reconcile_interval_seconds = num(val()?)?,
                "--cni-config" => cfg.cni_config = val()?,
                other if cfg.metrics_serving.parse_flag(other, &mut val)? => {}
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        cfg.check_bounds()?;
        Ok(cfg)
    }

    /// Every number in range: a wait that could overflow the clock (`Instant + Duration`
    /// panics) or never end is refused at start, naming the field and its range.
    fn check_bounds(&self) -> Result<(), String> {
        use plexus_conf::bounds::check;
        let fields: [(&str, u64, (u64, u64)); 6] = [
            ("maxConcurrent", self.max_concurrent as u64, MAX_CONCURRENT),
            ("queueSize", self.queue_size as u64, QUEUE_SIZE),
            ("podWaitMs", self.pod_wait_ms, POD_WAIT_MS),
            ("drainSeconds", self.drain_seconds, DRAIN_SECONDS),
            ("apiTimeoutMs", self.api_timeout_ms, API_TIMEOUT_MS),
            (
                "reconcileIntervalSeconds",
                self.reconcile_interval_seconds,
                RECONCILE_INTERVAL_SECONDS,
            ),
        ];
        for (field, value, range) in fields {
            check(field, value, range).map_err(|e| format!("{}: {}", e.msg, e.details))?;
        }
        Ok(())
    }
}

/// How long a call waits for the pod cache's first LIST before it reads the pod itself: a
/// daemon restarted with the rest of a fleet serves its first calls from that LIST instead of
/// adding a GET each to the API server's queue (measured in docs/performance.md).
const INITIAL_SYNC_WAIT: Duration = Duration::from_secs(10);

/// What every call shares.
struct Shared {
    handle: tokio::runtime::Handle,
    client: Option<KubeClient>,
    caches: Arc<Caches>,
    metrics: Arc<Metrics>,
    pod_wait: Duration,
}

/// The verbs, served with the daemon's runtime, client and caches.
struct DaemonPlugin<'a>(&'a Shared);

impl DaemonPlugin<'_> {
    /// The call's context; `del`: the call is a DEL of `args`' container.
    fn ctx(&self, args: &CmdArgs, del: bool) -> Result<(Ctx, CacheInputs), CniError> {
        let s = self.0;
        // The worker started this call's phases (server::worker).
        let phase = plexus_delegates::timing::phase("config");
        let ctx = Ctx::new(args, None)?.with_shared(s.handle.clone(), s.client.clone());
        drop(phase);
        crate::claims_pending::note_dir(std::path::Path::new(&ctx.config.cni_dir));
        reconcile_run::note_call(&ctx.config.cni_dir, &args.stdin, &args.path);
        if let (Some(client), true) = (&s.client, status::background()) {
            // Writes a killed daemon left unsent (the first call for this cniDir only).
            let dir = std::path::Path::new(&ctx.config.cni_dir);
            for (file, rec) in crate::report::journal::take_for_replay(dir, &ctx.store) {
                if del && rec.container_id == args.container_id {
                    // This very DEL drops it (as `status::cancel` would): a replay spawned
                    // here could be sent before the cancel below runs.
                    crate::report::journal::finished(&file);
                    continue;
                }
                ctx.spawn_detached(status::replay(client, rec, file));
            }
        }
        let inputs = CacheInputs {
            caches: Arc::clone(&s.caches),
            client: s.client.clone(),
            pod_wait: s.pod_wait,
            sync_wait: INITIAL_SYNC_WAIT,
            metrics: Arc::clone(&s.metrics),
        };
        Ok((ctx, inputs))
    }
}

impl Plugin for DaemonPlugin<'_> {
    fn add(&self, args: CmdArgs) -> Result<AddOutput, CniError> {
        let started = std::time::Instant::now();
        let (mut ctx, mut inputs) = self.ctx(&args, false)?;
        let out = status::for_container(&args.container_id, &args.ifname, || {
            add::add(&mut ctx, &mut inputs, &args)
        });
        tracing::info!(container = %args.container_id, ok = out.is_ok(), elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            phases = ?plexus_delegates::timing::summary(), "ADD done");
        out.map_err(CniError::from)
    }

    fn del(&self, args: CmdArgs) -> Result<(), CniError> {
        let (mut ctx, mut inputs) = self.ctx(&args, true)?;
        // A status write of this container not sent yet never will be.
        status::cancel(&args.container_id);
        del::del(&mut ctx, &mut inputs, &args).map_err(CniError::from)
    }

    fn check(&self, args: CmdArgs) -> Result<(), CniError> {
        let (mut ctx, _) = self.ctx(&args, false)?;
        check::check(&mut ctx, &args).map_err(CniError::from)
    }

    fn status(&self, args: CmdArgs) -> Result<(), CniError> {
        let (mut ctx, _) = self.ctx(&args, false)?;
        check::status(&mut ctx).map_err(CniError::from)
    }

    fn gc(&self, args: CmdArgs) -> Result<(), CniError> {
        let (mut ctx, _) = self.ctx(&args, false)?;
        check::gc(&mut ctx, &args).map_err(CniError::from)
    }
}

fn serve_one(shared: &Shared, req: Request) -> Response {
    let env = req.env;
    let out = skel::dispatch(
        &DaemonPlugin(shared),
        |k| env.get(k).cloned(),
        req.stdin.into_bytes(),
    );
    Response {
        code: out.exit_code,
        stdout: out.stdout,
    }
}

/// The daemon's logging: stderr (the container's log) always, its own file when set.
fn log_options(cfg: &DaemonConfig) -> plexus_delegates::logging::LogOptions {
    let level = if cfg.log_level.is_empty() {
        std::env::var("PLEXUS_LOG_LEVEL").unwrap_or_else(|_| "info".into())
    } else {
        cfg.log_level.clone()
    };
    plexus_delegates::logging::LogOptions {
        level,
        file: (!cfg.log_file.is_empty()).then(|| PathBuf::from(&cfg.log_file)),
        to_stderr: true,
        max_size_mb: 100,
        max_backups: 5,
    }
}

async fn build_client(cfg: &DaemonConfig) -> Result<Option<KubeClient>, String> {
    let opts = ClientOptions {
        retry: RetryPolicy {
            total: Duration::from_millis(cfg.api_timeout_ms),
            interval: Duration::from_millis(250),
        },
        ..ClientOptions::for_node(&cfg.node_name)
    };
    let kubeconfig = (!cfg.kubeconfig.is_empty()).then(|| PathBuf::from(&cfg.kubeconfig));
    let in_cluster = InClusterEnv::from_process_env();
    KubeClient::from_settings_with_kube(kubeconfig.as_deref(), in_cluster.as_ref(), opts)
        .await
        .map_err(|e| e.to_string())
}

/// `plexus daemon …`: run until SIGTERM/SIGINT; returns the exit code.
pub fn main(argv: &[String]) -> i32 {
    if argv.first().map(String::as_str) == Some("reconcile") {
        return reconcile_run::main(&argv[1..]);
    }
    if argv.first().map(String::as_str) == Some("--version") {
        println!("{}", crate::build_info::version_line("plexus-daemon"));
        return 0;
    }
    if argv.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return 0;
    }
    let cfg = match DaemonConfig::from_args(argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("plexus daemon: {e}\n{USAGE}");
            return 2;
        }
    };
    plexus_delegates::logging::init_with_format(
        &log_options(&cfg),
        plexus_delegates::logging::Format::parse(&cfg.log_format).unwrap_or_default(),
    );
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("plexus-async")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plexus daemon: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match run(&cfg, &rt) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "plexus daemon failed");
            eprintln!("plexus daemon: {e}");
            1
        }
    }
}

/// When the daemon's first reconciler pass runs: once the calls right after a start (a restart
/// under load) have named their configs.
const RECONCILE_FIRST: Duration = Duration::from_secs(10);

/// How often the daemon releases the address claims DELs could not (the API server was down).
const CLAIM_SWEEP: Duration = Duration::from_secs(60);

/// Release, every [`CLAIM_SWEEP`], the address claims recorded in the `cniDir`s served so far
/// ([`crate::claims_pending`]).
async fn sweep_pending_claims(client: KubeClient) {
    let mut tick = tokio::time::interval(CLAIM_SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for dir in crate::claims_pending::served_dirs() {
            let pending = crate::claims_pending::pending(&dir);
            if !pending.is_empty() {
                crate::address_guard::release_recorded(&client, pending).await;
            }
        }
    }
}

fn run(cfg: &DaemonConfig, rt: &tokio::runtime::Runtime) -> Result<(), String> {
    plexus_delegates::hostroot::set(std::path::Path::new(&cfg.host_root))?;
    if let Some(root) = plexus_delegates::hostroot::get() {
        tracing::info!(host_root = %root.display(), "delegates run chrooted into the host root");
    }
    let client = rt.block_on(build_client(cfg))?;
    let caches = Arc::new(Caches::default());
    let metrics = Arc::new(Metrics::new());
    match &client {
        Some(c) => {
            if cfg.node_name.is_empty() {
                tracing::warn!("no node name (PLEXUS_NODE_NAME or nodeName): watching every pod of the cluster");
            }
            rt.spawn(cache::run_watches(
                Arc::clone(&caches),
                c.clone(),
                cfg.node_name.clone(),
                Arc::clone(&metrics),
            ));
            rt.spawn(sweep_pending_claims(c.clone()));
        }
        None => {
            tracing::warn!("no API configured: serving static mode");
            caches.mark_static();
        }
    }
    if !cfg.metrics_address.is_empty() {
        let source = Arc::new(metrics_http::DaemonSource {
            metrics: Arc::clone(&metrics),
            caches: Arc::clone(&caches),
        });
        metrics_http::start(
            rt.handle(),
            &cfg.metrics_address,
            &cfg.metrics_serving,
            client.as_ref().and_then(|c| c.kube_client()),
            source,
        )?;
    }
    status::set_background(!cfg.status_in_call);
    if cfg.reconcile_interval_seconds > 0 {
        reconcile_run::spawn_in_daemon(
            rt.handle().clone(),
            client.clone(),
            cfg.cni_config.clone(),
            Duration::from_secs(cfg.reconcile_interval_seconds),
            RECONCILE_FIRST,
        );
    }
    let path = PathBuf::from(&cfg.socket_path);
    let listener = server::bind(&path).map_err(|e| format!("socket {}: {e}", path.display()))?;
    let shared = Arc::new(Shared {
        handle: rt.handle().clone(),
        client,
        caches: Arc::clone(&caches),
        metrics: Arc::clone(&metrics),
        pod_wait: Duration::from_millis(cfg.pod_wait_ms),
    });
    let handler: Arc<server::Handler> = Arc::new(move |req| serve_one(&shared, req));
    let srv = server::Server::start(
        listener,
        &path,
        server::Limits {
            max_concurrent: cfg.max_concurrent,
            queue_size: cfg.queue_size,
        },
        Arc::clone(&metrics),
        handler,
    );
    tracing::info!(socket = %path.display(), max_concurrent = cfg.max_concurrent, queue_size = cfg.queue_size, node = %cfg.node_name, "plexus daemon serving");
    let readiness = (!cfg.readiness_file.is_empty()).then(|| PathBuf::from(&cfg.readiness_file));
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| e.to_string())?;
        let mut ready_written = readiness.is_none();
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = tick.tick(), if !ready_written => {
                    if caches.synced() {
                        if let Some(f) = &readiness {
                            std::fs::write(f, b"ready\n").map_err(|e| format!("{}: {e}", f.display()))?;
                            tracing::info!(file = %f.display(), "caches synced: ready");
                        }
                        ready_written = true;
                    }
                }
            }
        }
        Ok::<(), String>(())
    })?;
    tracing::info!("SIGTERM: draining (new calls are refused, shims fall back)");
    if let Some(f) = &readiness {
        let _ = std::fs::remove_file(f);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(cfg.drain_seconds);
    let left = srv.drain(Duration::from_secs(cfg.drain_seconds));
    if left > 0 {
        tracing::warn!(left, "calls still running at the end of the drain period");
    }
    // The network-status writes that follow answered ADDs (each pod's newest).
    let unwritten = status::wait_idle(deadline);
    if unwritten > 0 {
        tracing::warn!(
            unwritten,
            "network-status writes still pending at the end of the drain period"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn numbers_out_of_range_are_refused_naming_the_field() {
        for (flag, field) in [
            ("--drain-seconds", "drainSeconds"),
            ("--pod-wait-ms", "podWaitMs"),
            ("--queue-size", "queueSize"),
            ("--max-concurrent", "maxConcurrent"),
        ] {
            let e = DaemonConfig::from_args(&args(&[flag, "18446744073709551615"])).unwrap_err();
            assert!(e.contains(field) && e.contains("between"), "{flag}: {e}");
        }
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("d.json");
        std::fs::write(&f, br#"{"apiTimeoutMs":0}"#).unwrap();
        let e = DaemonConfig::from_args(&args(&["--config", f.to_str().unwrap()])).unwrap_err();
        assert!(e.contains("apiTimeoutMs"), "{e}");
        assert!(DaemonConfig::from_args(&args(&["--drain-seconds", "3600"])).is_ok());
    }

    #[test]
    fn flags_override_the_config_file() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("d.json");
        std::fs::write(
            &f,
            br#"{"socketPath":"/x/s.sock","maxConcurrent":3,"queueSize":9}"#,
        )
        .unwrap();
        let c = DaemonConfig::from_args(&args(&[
            "--config",
            f.to_str().unwrap(),
            "--queue-size",
            "4",
        ]))
        .unwrap();
        assert_eq!(
            (c.socket_path.as_str(), c.max_concurrent, c.queue_size),
            ("/x/s.sock", 3, 4)
        );
        assert_eq!(c.pod_wait_ms, 1000);
        assert!(DaemonConfig::from_args(&args(&["--max-concurrent", "0"])).is_err());
        assert!(DaemonConfig::from_args(&args(&["--bogus"])).is_err());
        let c = DaemonConfig::from_args(&args(&["--log-file", "/l/d.log", "--log-level", "debug"]))
            .unwrap();
        let o = log_options(&c);
        assert_eq!(o.file, Some(PathBuf::from("/l/d.log")));
        assert_eq!((o.level.as_str(), o.to_stderr), ("debug", true));
        assert_eq!(log_options(&DaemonConfig::default()).file, None);
        let c = DaemonConfig::from_args(&args(&["--host-root", "/hostroot"])).unwrap();
        assert_eq!(c.host_root, "/hostroot");
        assert_eq!(DaemonConfig::default().host_root, "");
    }
}
