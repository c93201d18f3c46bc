//! Where the node reconciler ([`super::reconcile`]) runs: a thread of the daemon (at start and
//! every `reconcileIntervalSeconds`, over the plexus configs it has served calls with and its
//! `cniConfig` file), and `plexus-daemon reconcile --config FILE` (`plexus daemon reconcile …`):
//! one pass, which `install.sh --watch` runs in thin mode on a host, or with `--every SECONDS` a
//! loop, which the thin DaemonSet's privileged `reconcile` container runs (its installer is
//! unprivileged and does not). The thin `plexus` binary does no reconciler work: its ADD and DEL
//! are unchanged.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use plexus_conf::plexus_config::PlexusConfig;
use serde_json::Value;

use crate::context::Ctx;
use crate::k8s::{InClusterEnv, KubeClient};

/// The configs calls were served with, per `cniDir`: (config bytes, `CNI_PATH`).
type Seen = BTreeMap<String, (Vec<u8>, Vec<PathBuf>)>;

static SEEN: Mutex<Seen> = Mutex::new(BTreeMap::new());

/// Note the config of a call (cheap: a comparison while it is unchanged).
pub fn note_call(cni_dir: &str, stdin: &[u8], cni_path: &[PathBuf]) {
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    match seen.get(cni_dir) {
        Some((s, p)) if s == stdin && p == cni_path => {}
        _ => {
            seen.insert(cni_dir.to_string(), (stdin.to_vec(), cni_path.to_vec()));
        }
    }
}

/// True when the config (a plugin config or a conflist) selects daemon mode (`daemonSocket`).
fn is_shim_config(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes)
        .ok()
        .map(|v| {
            let plugin = v
                .get("plugins")
                .and_then(Value::as_array)
                .and_then(|ps| ps.first().cloned())
                .unwrap_or(v);
            plugin
                .get("daemonSocket")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        })
        .unwrap_or(false)
}

/// The daemon's `cniConfig` default: the config `install.sh` publishes, if there is one.
const DEFAULT_CNI_CONFIGS: [&str; 2] = [
    "/etc/cni/net.d/00-plexus.conflist",
    "/etc/cni/net.d/00-plexus.conf",
];

/// The daemon's reconciler: a pass `first` after start, then every `interval`, over every
/// config seen in calls and `cni_config` (empty: [`DEFAULT_CNI_CONFIGS`]). Runs on a thread of
/// its own (delegates are exec'd, futures driven through `handle`).
pub fn spawn_in_daemon(
    handle: tokio::runtime::Handle,
    client: Option<KubeClient>,
    cni_config: String,
    interval: Duration,
    first: Duration,
) {
    let started = std::thread::Builder::new()
        .name("plexus-reconcile".into())
        .spawn(move || {
            std::thread::sleep(first);
            loop {
                for (stdin, cni_path) in configs(&cni_config) {
                    let Ok(config) = PlexusConfig::parse(&stdin) else {
                        continue;
                    };
                    let mut ctx = Ctx::from_config(config, &cni_path, None)
                        .with_shared(handle.clone(), client.clone());
                    let root = plexus_delegates::hostroot::get();
                    super::reconcile::run_once(&mut ctx, root);
                }
                std::thread::sleep(interval);
            }
        });
    match started {
        Ok(_) => tracing::info!(
            interval_s = interval.as_secs(),
            "node reconciler started (releases sandboxes the runtime no longer lists)"
        ),
        Err(e) => tracing::warn!(error = %e, "cannot start the node reconciler's thread"),
    }
}

/// The configs a daemon pass covers, one per `cniDir`: the calls' (newest), then the file.
fn configs(cni_config: &str) -> Vec<(Vec<u8>, Vec<PathBuf>)> {
    let mut by_dir: Seen = SEEN.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let files: Vec<PathBuf> = if cni_config.is_empty() {
        DEFAULT_CNI_CONFIGS.iter().map(PathBuf::from).collect()
    } else {
        vec![PathBuf::from(cni_config)]
    };
    if let Some(bytes) = files.iter().find_map(|f| std::fs::read(f).ok()) {
        if let Ok(c) = PlexusConfig::parse(&bytes) {
            by_dir.entry(c.cni_dir).or_insert((bytes, Vec::new()));
        }
    }
    by_dir.into_values().collect()
}

const USAGE: &str =
    "usage: plexus-daemon reconcile --config FILE [--config FILE…] [--cni-path DIR[:DIR…]]
                              [--host-root DIR] [--every SECONDS]
                              [--metrics-address HOST:PORT [--metrics-dir DIR]
                               [--metrics-insecure-http]
                               [--metrics-cert-file PEM --metrics-key-file PEM]]
  A pass of the node reconciler over the first FILE that exists (a plexus config or the
  conflist holding it), over its cniDir: releases every saved plan whose sandbox the runtime
  (runtimeEndpoint) no longer lists and that is older than reconcileGraceSeconds. Delegates are
  found in binDir, then --cni-path (default $CNI_PATH); with --host-root they run chrooted into
  it (the host's / as mounted in a container). A daemon-mode config (daemonSocket) is left to
  the daemon.
  --every SECONDS: a pass every SECONDS (1-86400) until SIGTERM/SIGINT, logging to stderr; no
  config yet (the installer has not published one), a daemon-mode config and a config that
  does not parse are logged and waited out. Without it: one pass.
  --metrics-address HOST:PORT (with --every): thin mode's metrics exporter. Reads the call
  outcomes thin calls append to DIR/outcomes.jsonl (default /var/lib/cni/plexus/metrics) and
  serves them as /metrics (HTTPS, TokenReview + SubjectAccessReview; plain HTTP only on a
  loopback address), with /healthz and /readyz. See docs/metrics.md.";

/// Thin mode's metrics directory (the default `cniDir`'s `metrics`).
const DEFAULT_METRICS_DIR: &str = "/var/lib/cni/plexus/metrics";

/// How often the exporter reads the outcome file.
const TAIL_EVERY: Duration = Duration::from_secs(1);

/// Bounds of `--every`, seconds.
const EVERY_SECONDS: (u64, u64) = (1, 86_400);

/// `plexus-daemon reconcile`'s arguments.
#[derive(Debug, PartialEq)]
struct Opts {
    /// The configs to cover, the first that exists (install.sh publishes `.conflist` or `.conf`).
    configs: Vec<PathBuf>,
    cni_path: Vec<PathBuf>,
    host_root: Option<PathBuf>,
    /// Loop mode: a pass every this often; `None`: one pass.
    every: Option<Duration>,
    /// The metrics exporter's address; `None`: no exporter.
    metrics_address: Option<String>,
    /// Where thin calls append their outcomes.
    metrics_dir: PathBuf,
    /// How the exporter serves (TLS, access).
    metrics_serving: super::metrics_http::Serving,
}

impl Opts {
    /// From `argv` (after `reconcile`); `cni_path_env` is `$CNI_PATH`. `Ok(None)`: `--help`.
    fn parse(
        argv: &[String],
        cni_path_env: Option<&std::ffi::OsStr>,
    ) -> Result<Option<Opts>, String> {
        let mut o = Opts {
            configs: Vec::new(),
            cni_path: cni_path_env
                .map(|p| std::env::split_paths(p).collect())
                .unwrap_or_default(),
            host_root: None,
            every: None,
            metrics_address: None,
            metrics_dir: PathBuf::from(DEFAULT_METRICS_DIR),
            metrics_serving: Default::default(),
        };
        let mut it = argv.iter();
        while let Some(a) = it.next() {
            if a == "-h" || a == "--help" {
                return Ok(None);
            }
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{a} wants a value"))
            };
            if o.metrics_serving.parse_flag(a, &mut value)? {
                continue;
            }
            let v = match a.as_str() {
                "--config" | "--cni-path" | "--host-root" | "--every" | "--metrics-address"
                | "--metrics-dir" => it.next().ok_or(format!("{a} wants a value"))?,
                _ => return Err(format!("bad argument {a:?}")),
            };
            match a.as_str() {
                "--config" => o.configs.push(PathBuf::from(v)),
                "--cni-path" => o.cni_path = std::env::split_paths(v).collect(),
                "--host-root" => o.host_root = Some(PathBuf::from(v)),
                "--metrics-address" => o.metrics_address = Some(v.clone()),
                "--metrics-dir" => o.metrics_dir = PathBuf::from(v),
                _ => {
                    let n = v
                        .parse::<u64>()
                        .map_err(|e| format!("--every {v:?}: {e}"))?;
                    plexus_conf::bounds::check("--every", n, EVERY_SECONDS)
                        .map_err(|e| format!("{}: {}", e.msg, e.details))?;
                    o.every = Some(Duration::from_secs(n));
                }
            }
        }
        if o.configs.is_empty() {
            return Err("--config is required".into());
        }
        if o.metrics_address.is_some() && o.every.is_none() {
            return Err("--metrics-address wants --every (the exporter runs with the loop)".into());
        }
        Ok(Some(o))
    }
}

/// What one pass found.
#[derive(Debug)]
enum Outcome {
    /// None of the configs exists.
    NoConfig,
    /// The config is daemon mode's: the daemon covers it.
    DaemonMode(PathBuf),
    /// The config could not be read or parsed.
    Bad(String),
    /// A pass ran; how many plans could not be released.
    Ran { failed: usize },
}

/// `plexus-daemon reconcile …`: one pass, or with `--every` a pass every so often until
/// SIGTERM. One pass: 0 when it ran or had nothing to do (a runtime that cannot be asked is
/// logged, not an error), 1 when a plan could not be released, 2 on usage or a config that
/// cannot be read. Loop mode: 0 at SIGTERM/SIGINT, 2 on usage, 1 when signals cannot be caught.
pub fn main(argv: &[String]) -> i32 {
    let cni_path_env = std::env::var_os("CNI_PATH");
    let o = match Opts::parse(argv, cni_path_env.as_deref()) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("plexus-daemon reconcile: {e}\n{USAGE}");
            return 2;
        }
    };
    if let Some(root) = &o.host_root {
        if let Err(e) = plexus_delegates::hostroot::set(root) {
            eprintln!("plexus-daemon reconcile: --host-root: {e}");
            return 2;
        }
    }
    match o.every {
        None => match pass(&o, true) {
            Outcome::NoConfig => {
                eprintln!(
                    "plexus-daemon reconcile: none of {} exists",
                    names(&o.configs)
                );
                2
            }
            Outcome::Bad(e) => {
                eprintln!("plexus-daemon reconcile: {e}");
                2
            }
            Outcome::DaemonMode(_) => 0,
            Outcome::Ran { failed } => i32::from(failed > 0),
        },
        Some(every) => run_loop(&o, every),
    }
}

/// Thin mode's metrics exporter ([`super::metrics::tail`]): a thread with a runtime of its
/// own that reads the call outcomes every [`TAIL_EVERY`] and serves the registry on `address`.
fn start_exporter(address: &str, o: &Opts) -> Result<(), String> {
    use super::metrics::{tail, vf_pool, Metrics};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("plexus-metrics")
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the metrics runtime: {e}"))?;
    // Its existence turns the thin calls' recording on.
    crate::outcome::make_dir(&o.metrics_dir)?;
    let metrics = std::sync::Arc::new(Metrics::for_mode("thin"));
    // The reconciler's own requests and delegate execs count too, as the daemon's do.
    crate::outcome::install(std::sync::Arc::clone(&metrics) as _);
    let client = match InClusterEnv::from_process_env() {
        Some(env) => rt
            .block_on(KubeClient::from_settings_with_kube(
                None,
                Some(&env),
                crate::k8s::ClientOptions::default(),
            ))
            .map_err(|e| tracing::warn!(error = %e, "metrics: no API client for TokenReview"))
            .ok()
            .flatten()
            .and_then(|c| c.kube_client()),
        None => None,
    };
    let source = std::sync::Arc::new(tail::ThinSource {
        metrics: std::sync::Arc::clone(&metrics),
    });
    super::metrics_http::start(rt.handle(), address, &o.metrics_serving, client, source)?;
    vf_pool::spawn_refresh(
        std::sync::Arc::clone(&metrics),
        vf_pool::SYSFS,
        vf_pool::REFRESH,
    );
    let dir = o.metrics_dir.clone();
    tracing::info!(dir = %dir.display(), "metrics exporter reading thin calls' outcomes");
    std::thread::Builder::new()
        .name("plexus-metrics-tail".into())
        .spawn(move || {
            // The runtime serving the endpoint lives as long as this thread.
            let _rt = rt;
            let mut t = tail::Tail::new(&dir);
            loop {
                t.poll(&metrics);
                std::thread::sleep(TAIL_EVERY);
            }
        })
        .map_err(|e| format!("cannot start the metrics exporter: {e}"))?;
    Ok(())
}

fn names(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One pass over the first of `o.configs` that exists; `init_log`: set up logging from the
/// config (one-pass mode; loop mode logs to stderr from the start).
fn pass(o: &Opts, init_log: bool) -> Outcome {
    let Some((config, bytes)) = o.configs.iter().find_map(|f| {
        match plexus_delegates::fsutil::read_capped(f, plexus_conf::limits::MAX_CONFIG_FILE_BYTES) {
            Ok(b) => Some((f, Ok(b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some((f, Err(e))),
        }
    }) else {
        return Outcome::NoConfig;
    };
    let bytes = match bytes {
        Ok(b) => b,
        Err(e) => return Outcome::Bad(format!("{}: {e}", config.display())),
    };
    // Before parsing: a daemon-mode config (of type plexus-shim, say) is the daemon's to cover.
    if is_shim_config(&bytes) {
        return Outcome::DaemonMode(config.clone());
    }
    let parsed = match PlexusConfig::parse(&bytes) {
        Ok(c) => c,
        Err(e) => return Outcome::Bad(format!("{}: {}: {}", config.display(), e.msg, e.details)),
    };
    if init_log {
        init_logging(&parsed);
    }
    let mut ctx = Ctx::from_config(parsed, &o.cni_path, InClusterEnv::from_process_env());
    let pass = super::reconcile::run_once(&mut ctx, plexus_delegates::hostroot::get());
    Outcome::Ran {
        failed: pass.failed,
    }
}

/// `--every`: a pass, then a wait of `every` (cut short by SIGTERM/SIGINT), and again. What a
/// pass finds is logged when it changes (no config, daemon mode, a bad config), not every time.
fn run_loop(o: &Opts, every: Duration) -> i32 {
    let level = std::env::var("PLEXUS_LOG_LEVEL")
        .ok()
        .filter(|l| matches!(l.as_str(), "debug" | "trace"))
        .unwrap_or_else(|| "info".into());
    plexus_delegates::logging::init(&plexus_delegates::logging::LogOptions {
        level,
        file: None,
        to_stderr: true,
        max_size_mb: 100,
        max_backups: 5,
    });
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plexus-daemon reconcile: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let signals = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    });
    let (mut term, mut int) = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("plexus-daemon reconcile: cannot catch SIGTERM: {e}");
            return 1;
        }
    };
    if let Some(address) = &o.metrics_address {
        if let Err(e) = start_exporter(address, o) {
            tracing::error!(error = %e, "metrics exporter not started");
            eprintln!("plexus-daemon reconcile: {e}");
            return 2;
        }
    }
    tracing::info!(
        every_s = every.as_secs(),
        configs = %names(&o.configs),
        "node reconciler loop started (releases sandboxes the runtime no longer lists)"
    );
    let mut last = String::new();
    loop {
        let said = match pass(o, false) {
            Outcome::NoConfig => {
                let s = format!("no plexus config yet ({}): waiting", names(&o.configs));
                if s != last {
                    tracing::info!("{s}");
                }
                s
            }
            Outcome::DaemonMode(f) => {
                let s = format!(
                    "{} is a daemon-mode config: the daemon reconciles",
                    f.display()
                );
                if s != last {
                    tracing::info!("{s}");
                }
                s
            }
            Outcome::Bad(e) => {
                if e != last {
                    tracing::warn!(error = %e, "reconciler: the config cannot be used; nothing reclaimed");
                }
                e
            }
            Outcome::Ran { failed } => {
                if failed > 0 {
                    tracing::warn!(failed, "reconciler: plans not released (next pass retries)");
                }
                String::new()
            }
        };
        last = said;
        let stop = rt.block_on(async {
            tokio::select! {
                _ = tokio::time::sleep(every) => false,
                _ = term.recv() => true,
                _ = int.recv() => true,
            }
        });
        if stop {
            tracing::info!("node reconciler loop stopped (signal)");
            return 0;
        }
    }
}

/// stderr (the installer's log) at `info` at least, and the config's `logFile`.
fn init_logging(c: &PlexusConfig) {
    let level = match c.log_level.as_str() {
        "debug" | "trace" => c.log_level.clone(),
        _ => "info".into(),
    };
    plexus_delegates::logging::init(&plexus_delegates::logging::LogOptions {
        level,
        file: (!c.log_file.is_empty()).then(|| PathBuf::from(&c.log_file)),
        to_stderr: true,
        max_size_mb: 100,
        max_backups: 5,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(a: &[&str]) -> Result<Option<Opts>, String> {
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        Opts::parse(&a, Some(std::ffi::OsStr::new("/env/a:/env/b")))
    }

    #[test]
    fn the_loop_and_its_configs_are_parsed() {
        let o = parse(&[
            "--config",
            "/etc/cni/net.d/00-plexus.conflist",
            "--config",
            "/etc/cni/net.d/00-plexus.conf",
            "--cni-path",
            "/opt/cni/bin",
            "--host-root",
            "/hostroot",
            "--every",
            "60",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            o,
            Opts {
                configs: vec![
                    PathBuf::from("/etc/cni/net.d/00-plexus.conflist"),
                    PathBuf::from("/etc/cni/net.d/00-plexus.conf")
                ],
                cni_path: vec![PathBuf::from("/opt/cni/bin")],
                host_root: Some(PathBuf::from("/hostroot")),
                every: Some(Duration::from_secs(60)),
                metrics_address: None,
                metrics_dir: PathBuf::from(DEFAULT_METRICS_DIR),
                metrics_serving: Default::default(),
            }
        );
        // One pass, $CNI_PATH by default.
        let o = parse(&["--config", "/c"]).unwrap().unwrap();
        assert_eq!(o.every, None);
        assert_eq!(
            o.cni_path,
            vec![PathBuf::from("/env/a"), PathBuf::from("/env/b")]
        );
        assert_eq!(o.host_root, None);
        assert_eq!(parse(&["--config", "/c", "--help"]).unwrap(), None);
    }

    #[test]
    fn bad_loop_arguments_are_refused_naming_them() {
        for (args, says) in [
            (
                &["--config", "/c", "--every", "0"][..],
                "between 1 and 86400",
            ),
            (
                &["--config", "/c", "--every", "86401"],
                "between 1 and 86400",
            ),
            (&["--config", "/c", "--every", "5s"], "--every \"5s\""),
            (&["--config", "/c", "--every", "-1"], "--every"),
            (&["--config", "/c", "--every"], "--every wants a value"),
            (&["--every", "5"], "--config is required"),
            (&["--config"], "--config wants a value"),
            (&["--config", "/c", "--loop"], "bad argument \"--loop\""),
            (
                &["--config", "/c", "--metrics-address", "127.0.0.1:9109"],
                "--metrics-address wants --every",
            ),
            (
                &["--config", "/c", "--metrics-dir"],
                "--metrics-dir wants a value",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
        assert!(parse(&["--config", "/c", "--every", "1"]).is_ok());
        assert!(parse(&["--config", "/c", "--every", "86400"]).is_ok());
        let o = parse(&[
            "--config",
            "/c",
            "--every",
            "5",
            "--metrics-address",
            "127.0.0.1:9109",
            "--metrics-dir",
            "/m",
            "--metrics-insecure-http",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(o.metrics_address.as_deref(), Some("127.0.0.1:9109"));
        assert_eq!(o.metrics_dir, PathBuf::from("/m"));
        assert!(o.metrics_serving.metrics_insecure_http);
    }

    #[test]
    fn a_pass_uses_the_first_config_that_exists_and_leaves_daemon_mode_alone() {
        let t = tempfile::tempdir().unwrap();
        let (list, conf) = (t.path().join("a.conflist"), t.path().join("a.conf"));
        let o = Opts {
            configs: vec![list.clone(), conf.clone()],
            cni_path: Vec::new(),
            host_root: None,
            every: None,
            metrics_address: None,
            metrics_dir: PathBuf::new(),
            metrics_serving: Default::default(),
        };
        assert!(matches!(pass(&o, false), Outcome::NoConfig));
        std::fs::write(&conf, br#"{"type":"plexus","daemonSocket":"/s"}"#).unwrap();
        assert!(matches!(pass(&o, false), Outcome::DaemonMode(f) if f == conf));
        std::fs::write(&list, b"{").unwrap();
        assert!(matches!(pass(&o, false), Outcome::Bad(e) if e.contains("a.conflist")));
    }

    #[test]
    fn a_daemon_mode_config_is_left_to_the_daemon() {
        assert!(is_shim_config(
            br#"{"type":"plexus","daemonSocket":"/run/plexus/plexus.sock"}"#
        ));
        assert!(is_shim_config(
            br#"{"name":"n","plugins":[{"type":"plexus","daemonSocket":"/s"}]}"#
        ));
        assert!(!is_shim_config(br#"{"type":"plexus","daemonSocket":""}"#));
        assert!(!is_shim_config(br#"{"type":"plexus"}"#));
        assert!(!is_shim_config(b"{"));
    }

    #[test]
    fn the_daemon_covers_each_cni_dir_once_newest_call_first() {
        note_call("/t/a", b"{\"cniDir\":\"/t/a\",\"x\":1}", &[]);
        note_call(
            "/t/a",
            b"{\"cniDir\":\"/t/a\",\"x\":2}",
            &[PathBuf::from("/b")],
        );
        let c: Vec<_> = configs("/nonexistent/file")
            .into_iter()
            .filter(|(s, _)| s.starts_with(b"{\"cniDir\":\"/t/a\""))
            .collect();
        assert_eq!(
            c,
            vec![(
                b"{\"cniDir\":\"/t/a\",\"x\":2}".to_vec(),
                vec![PathBuf::from("/b")]
            )]
        );
    }
}
