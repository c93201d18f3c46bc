//! Logging setup shared by the binaries: `tracing` to stderr and/or a file (0600), with a level.
//! stdout is never used: it carries the CNI result.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

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
    init_with_file(opts, file, warnings);
}

/// [`init`] with the log file already opened by the caller (`opts.file` is then only used to
/// know a file was wanted: `None` here with a file wanted logs to stderr). `warnings` are
/// logged once the subscriber is installed. For callers that open the file under their own
/// rules (the `sriov` plugin confines a NAD's `logFile`).
pub fn init_with_file(opts: &LogOptions, file: Option<std::fs::File>, warnings: Vec<String>) {
    let level = parse_level(&opts.level);
    let filter = level.unwrap_or(LevelFilter::WARN);
    let mut warn_msgs = warnings;
    if level.is_none() {
        warn_msgs.push(format!("unknown log level {:?}, using warn", opts.level));
    }
    let file_layer = file.map(|f| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(Mutex::new(f))
            .with_filter(filter)
    });
    let stderr_wanted = opts.to_stderr || (opts.file.is_some() && file_layer.is_none());
    let stderr_layer = stderr_wanted.then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_target(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
    });
    let _ = tracing_subscriber::registry()
        .with(file_layer)
        .with(stderr_layer)
        .try_init();
    for m in warn_msgs {
        tracing::warn!("{m}");
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
}
