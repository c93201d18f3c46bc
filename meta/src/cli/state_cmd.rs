//! `plexus state [--json]`: the arguments, where the state is ([`super::node_config`] or the
//! flags), and the human text of a [`Report`].

use super::node_config;
use super::state::{self, Report, Sandbox, Where};
use plexus_conf::plexus_config::DEFAULT_CNI_DIR;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

const USAGE: &str =
    "usage: plexus state [--json] [--config FILE] [--state-dir DIR] [--device-info-dir DIR]
                    [--runtime-endpoint unix:///run/containerd/containerd.sock] [--host-root DIR]
                    [--grace SECONDS]
  Lists this node's saved plans, their attachments, delegate result caches, address claims
  pending release, device-info files and metrics outcome files, and flags leftovers (state of
  sandboxes the runtime no longer lists, asked through its CRI socket). Read-only.
  --config defaults to the installed /etc/cni/net.d/00-plexus.conflist (or .conf); the state
  directory, device-info directory, runtime endpoint and grace period (reconcileGraceSeconds:
  younger state is not called a leftover) come from it; the flags override them.";

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn human_age(s: u64) -> String {
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn sandbox_word(s: Sandbox) -> &'static str {
    match s {
        Sandbox::Live => "live",
        Sandbox::Gone => "GONE",
        Sandbox::Unknown => "not cross-checked",
    }
}

/// The report as text for a person at a terminal.
pub fn text(r: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "state directory {} (config {})",
        r.state_dir.display(),
        r.config
            .as_ref()
            .map_or("none: defaults".to_string(), |p| p.display().to_string())
    );
    match (&r.runtime.endpoint, r.runtime.cross_checked) {
        (Some(e), true) => {
            let _ = writeln!(
                o,
                "runtime {}: {} sandboxes",
                e.display(),
                r.runtime.sandboxes.unwrap_or(0)
            );
        }
        _ => {
            let _ = writeln!(
                o,
                "runtime: {}",
                r.runtime.note.as_deref().unwrap_or("not cross-checked")
            );
        }
    }
    let _ = writeln!(o, "\nplans ({}):", r.plans.len());
    for p in &r.plans {
        let _ = writeln!(
            o,
            "  {} {}  pod {}  age {}  sandbox {}{}{}",
            short(&p.container_id),
            p.ifname,
            p.pod.as_deref().unwrap_or("-"),
            human_age(p.age_seconds),
            sandbox_word(p.sandbox),
            if p.netns_exists { "" } else { "  netns gone" },
            if p.del_failures > 0 {
                format!("  DEL failed {}x", p.del_failures)
            } else {
                String::new()
            }
        );
        for a in &p.attachments {
            let mut line = format!("      {:<8} {}", a.interface, a.network);
            if let Some(r) = &a.resource_name {
                let _ = write!(line, "  resource {r}");
            }
            if let Some(d) = &a.device_id {
                let _ = write!(line, "  device {d}");
            }
            for c in p.claims.iter().filter(|c| c.network == a.network) {
                let _ = write!(line, "  claim {}", c.address);
            }
            let _ = writeln!(o, "{line}");
        }
    }
    let files = |o: &mut String, title: &str, v: &[state::FileView]| {
        let _ = writeln!(o, "\n{title} ({}):", v.len());
        for f in v {
            let _ = writeln!(
                o,
                "  {}  container {}  {}  sandbox {}",
                f.file.display(),
                f.container_id.as_deref().map_or("?", short),
                if f.has_plan { "plan" } else { "no plan" },
                sandbox_word(f.sandbox)
            );
        }
    };
    files(&mut o, "delegate result caches", &r.result_caches);
    let _ = writeln!(
        o,
        "\naddress claims pending release ({}):",
        r.pending_claim_releases.len()
    );
    for c in &r.pending_claim_releases {
        let _ = writeln!(o, "  {} {}  pod {}", c.network, c.address, c.pod);
    }
    files(&mut o, "device-info files", &r.device_info_files);
    let _ = writeln!(
        o,
        "\nlock files {}, DEL tombstones {}",
        r.lock_files, r.tombstones
    );
    match &r.metrics {
        Some(m) => {
            let total: u64 = m.files.iter().map(|(_, n)| n).sum();
            let _ = writeln!(
                o,
                "metrics outcome files {}: {} files, {total} bytes",
                m.dir.display(),
                m.files.len()
            );
        }
        None => {
            let _ = writeln!(o, "metrics outcome files: none");
        }
    }
    if r.leftovers.is_empty() {
        let _ = writeln!(o, "\nleftovers: none");
    } else {
        let _ = writeln!(o, "\nLEFTOVERS ({}):", r.leftovers.len());
        for l in &r.leftovers {
            let _ = writeln!(
                o,
                "  {} {}{}{}: {}",
                l.kind,
                l.file.display(),
                l.container_id
                    .as_deref()
                    .map_or(String::new(), |c| format!(" container {}", short(c))),
                l.pod
                    .as_deref()
                    .map_or(String::new(), |p| format!(" pod {p}")),
                l.why
            );
        }
    }
    o
}

/// CLI entry; returns the exit code (0: the report printed, leftovers or not; 2: usage or no
/// usable config).
pub fn main(argv: &[String]) -> i32 {
    let mut json = false;
    let mut config = None;
    let mut state_dir = None;
    let mut devinfo_dir = None;
    let mut endpoint = None;
    let mut host_root = None;
    let mut grace = None;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned();
        match a.as_str() {
            "--json" => json = true,
            "--config" => config = val(),
            "--state-dir" => state_dir = val().map(PathBuf::from),
            "--device-info-dir" => devinfo_dir = val().map(PathBuf::from),
            "--runtime-endpoint" => endpoint = val(),
            "--host-root" => host_root = val().map(PathBuf::from),
            "--grace" => match val().and_then(|g| g.parse::<u64>().ok()) {
                Some(g) => grace = Some(g),
                None => {
                    eprintln!("--grace wants a number of seconds\n{USAGE}");
                    return 2;
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return 0;
            }
            other => {
                eprintln!("unknown argument {other:?}\n{USAGE}");
                return 2;
            }
        }
    }
    // The config tells where everything is; without one (none installed here), the flags and
    // the defaults do, unless the config was asked for by name.
    let node = match node_config::load(config.as_deref()) {
        Ok(n) => Some(n),
        Err(e) if config.is_some() => {
            eprintln!("plexus state: {e}");
            return 2;
        }
        Err(_) => None,
    };
    let cfg = node.as_ref().map(|n| &n.config);
    let at = Where {
        state_dir: state_dir
            .unwrap_or_else(|| PathBuf::from(cfg.map_or(DEFAULT_CNI_DIR, |c| c.cni_dir.as_str()))),
        device_info_dir: devinfo_dir.unwrap_or_else(|| {
            PathBuf::from(cfg.map_or(plexus_conf::k8s::devinfo::DEFAULT_DIR, |c| {
                c.device_info_dir.as_str()
            }))
        }),
        config: node.as_ref().map(|n| n.path.clone()),
        runtime_endpoint: endpoint
            .or_else(|| cfg.map(|c| c.runtime_endpoint.clone()))
            .unwrap_or_default(),
        grace: Duration::from_secs(
            grace.unwrap_or_else(|| cfg.map_or(0, |c| c.reconcile_grace_seconds)),
        ),
        host_root,
    };
    let runtime = state::ask_runtime(&at.runtime_endpoint, at.host_root.as_deref());
    let report = state::collect(&at, runtime, SystemTime::now());
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("plexus state: {e}");
                return 1;
            }
        }
    } else {
        print!("{}", text(&report));
    }
    0
}
