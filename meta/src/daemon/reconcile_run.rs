//! Where the node reconciler ([`super::reconcile`]) runs: a thread of the daemon (at start and
//! every `reconcileIntervalSeconds`, over the plexus configs it has served calls with and its
//! `cniConfig` file), and `plexus-daemon reconcile --config FILE` (`plexus daemon reconcile …`),
//! one pass, which `install.sh --watch` runs in thin mode. The thin `plexus` binary does no
//! reconciler work: its ADD and DEL are unchanged.

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
    "usage: plexus-daemon reconcile --config FILE [--cni-path DIR[:DIR…]] [--host-root DIR]
  One pass of the node reconciler over FILE's cniDir (a plexus config or the conflist holding it):
  releases every saved plan whose sandbox the runtime (runtimeEndpoint) no longer lists and
  that is older than reconcileGraceSeconds. Delegates are found in binDir, then --cni-path
  (default $CNI_PATH). A daemon-mode config (daemonSocket) is left to the daemon.";

/// `plexus-daemon reconcile …`: one pass; 0 when it ran or had nothing to do (a runtime that
/// cannot be asked is logged, not an error), 1 when a plan could not be released, 2 on usage.
pub fn main(argv: &[String]) -> i32 {
    let mut config = None;
    let mut cni_path: Vec<PathBuf> = std::env::var_os("CNI_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut host_root = None;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        match (a.as_str(), it.clone().next()) {
            ("-h" | "--help", _) => {
                println!("{USAGE}");
                return 0;
            }
            ("--config", Some(v)) => config = Some(PathBuf::from(v)),
            ("--cni-path", Some(v)) => cni_path = std::env::split_paths(v).collect(),
            ("--host-root", Some(v)) => host_root = Some(PathBuf::from(v)),
            _ => {
                eprintln!("plexus-daemon reconcile: bad argument {a:?}\n{USAGE}");
                return 2;
            }
        }
        it.next();
    }
    let Some(config) = config else {
        eprintln!("plexus-daemon reconcile: --config is required\n{USAGE}");
        return 2;
    };
    let bytes = match plexus_delegates::fsutil::read_capped(
        &config,
        plexus_conf::limits::MAX_CONFIG_FILE_BYTES,
    ) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("plexus-daemon reconcile: {}: {e}", config.display());
            return 2;
        }
    };
    // Before parsing: a daemon-mode config (of type plexus-shim, say) is the daemon's to cover.
    if is_shim_config(&bytes) {
        return 0;
    }
    let parsed = match PlexusConfig::parse(&bytes) {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "plexus-daemon reconcile: {}: {}: {}",
                config.display(),
                e.msg,
                e.details
            );
            return 2;
        }
    };
    init_logging(&parsed);
    if let Some(root) = &host_root {
        if let Err(e) = plexus_delegates::hostroot::set(root) {
            eprintln!("plexus-daemon reconcile: --host-root: {e}");
            return 2;
        }
    }
    let mut ctx = Ctx::from_config(parsed, &cni_path, InClusterEnv::from_process_env());
    let pass = super::reconcile::run_once(&mut ctx, host_root.as_deref());
    i32::from(pass.failed > 0)
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
