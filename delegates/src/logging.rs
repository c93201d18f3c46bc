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
    let level = parse_level(&opts.level);
    let filter = level.unwrap_or(LevelFilter::WARN);
    let mut warn_msgs = Vec::new();
    if level.is_none() {
        warn_msgs.push(format!("unknown log level {:?}, using warn", opts.level));
    }
    let file_layer = opts.file.as_ref().and_then(|p| {
        match OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(p)
        {
            Ok(f) => Some(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(Mutex::new(f))
                    .with_filter(filter),
            ),
            Err(e) => {
                warn_msgs.push(format!(
                    "cannot open log file {}: {e}; logging to stderr",
                    p.display()
                ));
                None
            }
        }
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
    fn levels() {
        assert_eq!(parse_level("verbose"), Some(LevelFilter::INFO));
        assert_eq!(parse_level("panic"), Some(LevelFilter::ERROR));
        assert_eq!(parse_level("DEBUG"), Some(LevelFilter::DEBUG));
        assert_eq!(parse_level("loud"), None);
    }
}
