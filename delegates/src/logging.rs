//! Logging setup shared by the binaries: `tracing` to stderr and/or a file (0600), with a level
//! or a per-module filter, as text or JSON lines. stdout is never used: it carries the CNI
//! result.
//!
//! - Level: a name (`error`, `warn`, `info`, `debug`, `trace`, Multus' `panic`/`verbose`), or
//!   per-module directives in `tracing`'s `EnvFilter` syntax, `target=level` pairs and a bare
//!   default level, comma-separated: `info,plexus_meta::k8s=debug`. A target matches itself and
//!   the modules below it; without a bare level the others log at `warn`. [`FILTER_ENV`]
//!   (`PLEXUS_LOG`), when set, replaces the configured level.
//! - Format: text (default) or JSON lines (`{"timestamp","level","fields":{"message",…},
//!   "target"}`, tracing-subscriber's `json` format), chosen by [`FORMAT_ENV`]
//!   (`PLEXUS_LOG_FORMAT=json`), else by the caller ([`init_with_format`]).

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Environment variable naming the log format: `text` (default) or `json`.
pub const FORMAT_ENV: &str = "PLEXUS_LOG_FORMAT";

/// Environment variable holding a level or per-module directives that replace the configured
/// level (`PLEXUS_LOG=info,plexus_meta::k8s=debug`).
pub const FILTER_ENV: &str = "PLEXUS_LOG";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// `<time> <LEVEL> <target>: <message> key=value…` (the file; stderr leaves the target out).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Format {
    /// `text`/`json` (any case); empty is text; anything else `None`.
    pub fn parse(s: &str) -> Option<Format> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "text" | "plain" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// Where and how much to log.
#[derive(Debug, Clone, Default)]
pub struct LogOptions {
    /// Level name: `error`, `warn`/`warning`, `info`, `debug`, `trace`, plus Multus' `panic`
    /// (errors only) and `verbose` (info). Empty means `warn`.
    pub level: String,
    /// Log file path, if any.
    pub file: Option<PathBuf>,
    /// Also log to stderr.
    pub to_stderr: bool,
    /// Rotate the file when it is larger than this many MB (Multus `logOptions.maxSize`);
    /// 0 disables rotation.
    pub max_size_mb: u64,
    /// Rotated files to keep (`logOptions.maxBackups`).
    pub max_backups: u32,
}

/// Size-based rotation at open time: `log` → `log.1` → … → `log.<max_backups>` (the oldest is
/// dropped). Concurrent plugin processes may race here; the loser just appends to the new file.
pub fn rotate_if_needed(path: &std::path::Path, max_size_mb: u64, max_backups: u32) {
    if max_size_mb == 0 {
        return;
    }
    let big =
        std::fs::metadata(path).is_ok_and(|m| m.len() > max_size_mb.saturating_mul(1024 * 1024));
    if !big {
        return;
    }
    let numbered = |i: u32| {
        let mut s = path.as_os_str().to_owned();
        s.push(format!(".{i}"));
        PathBuf::from(s)
    };
    if max_backups == 0 {
        let _ = std::fs::remove_file(path);
        return;
    }
    let _ = std::fs::remove_file(numbered(max_backups));
    for i in (1..max_backups).rev() {
        let _ = std::fs::rename(numbered(i), numbered(i + 1));
    }
    let _ = std::fs::rename(path, numbered(1));
}

/// A level name or per-module directives (see the module doc) as a filter; `None` when a
/// level or directive is not understood.
pub fn parse_filter(s: &str) -> Option<Targets> {
    let mut default = None;
    let mut targets = Targets::new();
    for d in s.split(',').map(str::trim) {
        if d.is_empty() && !s.trim().is_empty() {
            continue;
        }
        match d.split_once('=') {
            Some((target, level)) => {
                let target = target.trim();
                if target.is_empty() || target.contains(char::is_whitespace) {
                    return None;
                }
                targets = targets.with_target(target, parse_level(level.trim())?);
            }
            None => default = Some(parse_level(d)?),
        }
    }
    Some(targets.with_default(default.unwrap_or(LevelFilter::WARN)))
}

/// Map a level name (Multus' or tracing's) to a filter.
pub fn parse_level(s: &str) -> Option<LevelFilter> {
    Some(match s.to_ascii_lowercase().as_str() {
        "" => LevelFilter::WARN,
        "panic" | "error" => LevelFilter::ERROR,
        "warn" | "warning" => LevelFilter::WARN,
        "info" | "verbose" => LevelFilter::INFO,
        "debug" => LevelFilter::DEBUG,
        "trace" => LevelFilter::TRACE,
        "off" | "none" => LevelFilter::OFF,
        _ => return None,
    })
}

/// Install the global subscriber. If the file cannot be opened, logging goes to stderr and a
/// warning says why. Calling it twice keeps the first setup.
pub fn init(opts: &LogOptions) {
    init_with_format(opts, Format::Text);
}

/// [`init`] with the format a caller's config chose (e.g. a `logFormat` field);
/// [`FORMAT_ENV`], when set, still wins.
pub fn init_with_format(opts: &LogOptions, format: Format) {
    let mut warnings = Vec::new();
    let file = opts.file.as_ref().and_then(|p| {
        rotate_if_needed(p, opts.max_size_mb, opts.max_backups);
        OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(p)
            .map_err(|e| {
                warnings.push(format!(
                    "cannot open log file {}: {e}; logging to stderr",
                    p.display()
                ))
            })
            .ok()
    });
    init_file_format(opts, file, warnings, format);
}

/// [`init`] with the log file already opened by the caller (`opts.file` is then only used to
/// know a file was wanted: `None` here with a file wanted logs to stderr). `warnings` are
/// logged once the subscriber is installed. For callers that open the file under their own
/// rules (the `sriov` plugin confines a NAD's `logFile`).
pub fn init_with_file(opts: &LogOptions, file: Option<std::fs::File>, warnings: Vec<String>) {
    init_file_format(opts, file, warnings, Format::Text);
}

fn init_file_format(
    opts: &LogOptions,
    file: Option<std::fs::File>,
    warnings: Vec<String>,
    configured: Format,
) {
    let mut warn_msgs = warnings;
    let from_env = std::env::var(FILTER_ENV)
        .ok()
        .filter(|s| !s.trim().is_empty());
    let (source, wanted) = match &from_env {
        Some(s) => (FILTER_ENV, s.as_str()),
        None => ("log level", opts.level.as_str()),
    };
    let filter = parse_filter(wanted).unwrap_or_else(|| {
        warn_msgs.push(format!("unknown {source} {wanted:?}, using warn"));
        Targets::new().with_default(LevelFilter::WARN)
    });
    let format = match std::env::var(FORMAT_ENV) {
        Ok(s) => Format::parse(&s).unwrap_or_else(|| {
            warn_msgs.push(format!("unknown {FORMAT_ENV} {s:?}, using text"));
            configured
        }),
        Err(_) => configured,
    };
    let file_layer = file.map(|f| layer(format, Mutex::new(f), true, filter.clone()));
    let stderr_wanted = opts.to_stderr || (opts.file.is_some() && file_layer.is_none());
    let stderr_layer = stderr_wanted.then(|| layer(format, std::io::stderr, false, filter));
    // Each output is a boxed layer over the bare registry, so both go in one `Vec` layer.
    let layers: Vec<BoxedLayer> = file_layer.into_iter().chain(stderr_layer).collect();
    let _ = tracing_subscriber::registry().with(layers).try_init();
    for m in warn_msgs {
        tracing::warn!("{m}");
    }
}

type BoxedLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

/// One output: `format` to `writer`, through `filter`. Text on stderr leaves the target out
/// (the container log is read by people); JSON always has it.
fn layer<W>(format: Format, writer: W, target: bool, filter: Targets) -> BoxedLayer
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(writer);
    match format {
        Format::Text => fmt.with_target(target).with_filter(filter).boxed(),
        Format::Json => fmt.json().with_filter(filter).boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_max_backups() {
        let t = tempfile::tempdir().unwrap();
        let log = t.path().join("plexus.log");
        for round in 0..4 {
            std::fs::write(&log, vec![b'x'; 2 * 1024 * 1024 + round]).unwrap();
            rotate_if_needed(&log, 1, 2);
            assert!(!log.exists(), "round {round}");
        }
        assert!(t.path().join("plexus.log.1").exists() && t.path().join("plexus.log.2").exists());
        assert!(!t.path().join("plexus.log.3").exists());
        // The newest rotation is .1.
        assert_eq!(
            std::fs::metadata(t.path().join("plexus.log.1"))
                .unwrap()
                .len(),
            2 * 1024 * 1024 + 3
        );
        std::fs::write(&log, b"small").unwrap();
        rotate_if_needed(&log, 1, 2);
        assert!(log.exists());
    }

    #[test]
    fn levels() {
        assert_eq!(parse_level("verbose"), Some(LevelFilter::INFO));
        assert_eq!(parse_level("panic"), Some(LevelFilter::ERROR));
        assert_eq!(parse_level("DEBUG"), Some(LevelFilter::DEBUG));
        assert_eq!(parse_level("loud"), None);
    }

    #[test]
    fn per_module_filters() {
        use tracing::Level;
        let f = parse_filter("info,plexus_meta::k8s=debug").unwrap();
        assert!(f.would_enable("plexus_meta::k8s::client", &Level::DEBUG));
        assert!(!f.would_enable("plexus_meta::k8s::client", &Level::TRACE));
        assert!(!f.would_enable("plexus_meta::attach", &Level::DEBUG));
        assert!(f.would_enable("plexus_meta::attach", &Level::INFO));
        // Without a bare level the others log at warn; Multus' level names work per target.
        let f = parse_filter("plexus_meta::k8s=verbose").unwrap();
        assert!(f.would_enable("plexus_meta::k8s", &Level::INFO));
        assert!(!f.would_enable("plexus_delegates::exec", &Level::INFO));
        assert!(f.would_enable("plexus_delegates::exec", &Level::WARN));
        // A bare level alone is a level; empty is warn.
        let f = parse_filter("debug").unwrap();
        assert!(f.would_enable("anything", &Level::DEBUG));
        let f = parse_filter("").unwrap();
        assert!(
            !f.would_enable("anything", &Level::INFO) && f.would_enable("anything", &Level::WARN)
        );
        assert!(parse_filter("info,plexus_meta=loud").is_none());
        assert!(parse_filter("=debug").is_none());
        assert!(parse_filter("loud").is_none());
    }

    #[test]
    fn formats() {
        assert_eq!(Format::parse("JSON"), Some(Format::Json));
        assert_eq!(Format::parse(""), Some(Format::Text));
        assert_eq!(Format::parse("text"), Some(Format::Text));
        assert_eq!(Format::parse("xml"), None);
    }
}
