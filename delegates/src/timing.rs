//! Where one CNI call's time went: named phases measured with a guard and summed per name, for
//! the call's closing log line (`phases="config=0.10 pod_get=2.31 …"`, milliseconds).
//!
//! The record is per thread: a thin-mode call runs on one thread, and a daemon worker runs one
//! call at a time, so phases of concurrent calls never mix. [`reset`] starts a call's record.

use std::cell::RefCell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Told of each delegate exec: `(verb, plugin type, duration, ok)` (the metrics, see
/// `plexus_meta::outcome`).
pub type DelegateHook = fn(&str, &str, Duration, bool);

static DELEGATE_HOOK: OnceLock<DelegateHook> = OnceLock::new();

/// Install the delegate hook (the first one stays).
pub fn set_delegate_hook(hook: DelegateHook) {
    let _ = DELEGATE_HOOK.set(hook);
}

/// A delegate exec finished: tell the hook, if one is installed.
pub fn delegate_done(verb: &str, plugin_type: &str, took: Duration, ok: bool) {
    if let Some(h) = DELEGATE_HOOK.get() {
        h(verb, plugin_type, took, ok);
    }
}

thread_local! {
    static PHASES: RefCell<Vec<(&'static str, Duration)>> = const { RefCell::new(Vec::new()) };
}

/// Measures from its creation to its drop and adds that to the phase `name`.
#[must_use = "the phase ends when the guard is dropped"]
pub struct PhaseGuard {
    name: &'static str,
    started: Instant,
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        record(self.name, self.started.elapsed());
    }
}

/// Start measuring the phase `name` (ends when the guard drops).
pub fn phase(name: &'static str) -> PhaseGuard {
    PhaseGuard {
        name,
        started: Instant::now(),
    }
}

/// Add `elapsed` to the phase `name`.
pub fn record(name: &'static str, elapsed: Duration) {
    PHASES.with(|p| {
        let mut p = p.borrow_mut();
        match p.iter_mut().find(|(n, _)| *n == name) {
            Some((_, total)) => *total += elapsed,
            None => p.push((name, elapsed)),
        }
    });
}

/// Forget this thread's phases (the start of a call).
pub fn reset() {
    PHASES.with(|p| p.borrow_mut().clear());
}

/// The phases recorded since the last [`reset`], in first-seen order.
pub fn phases() -> Vec<(&'static str, Duration)> {
    PHASES.with(|p| p.borrow().clone())
}

/// `name=milliseconds` pairs, space-separated, in first-seen order (two decimals).
pub fn summary() -> String {
    phases()
        .iter()
        .map(|(n, d)| format!("{n}={:.2}", d.as_secs_f64() * 1000.0))
        .collect::<Vec<_>>()
        .join(" ")
}

/// This process' peak resident set so far (`VmHWM` in `/proc/self/status`), in KiB; 0 when
/// unreadable. Unlike `getrusage(RUSAGE_CHILDREN)` seen from a parent, it never counts the
/// delegates this process ran.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_sum_per_name_in_first_seen_order_and_reset() {
        reset();
        record("b", Duration::from_micros(1500));
        record("a", Duration::from_millis(2));
        record("b", Duration::from_micros(500));
        assert_eq!(summary(), "b=2.00 a=2.00");
        {
            let _g = phase("c");
            std::thread::sleep(Duration::from_millis(2));
        }
        let c = phases().into_iter().find(|(n, _)| *n == "c").unwrap().1;
        assert!(c >= Duration::from_millis(2), "{c:?}");
        reset();
        assert!(phases().is_empty());
    }

    #[test]
    fn peak_rss_grows_with_touched_memory() {
        let before = peak_rss_kib();
        assert!(before > 0);
        let v = vec![1u8; 32 << 20];
        assert!(v.iter().step_by(4096).all(|b| *b == 1));
        assert!(
            peak_rss_kib() >= before + 16 * 1024,
            "{before} -> {}",
            peak_rss_kib()
        );
    }

    #[test]
    fn threads_keep_their_own_record() {
        reset();
        record("main", Duration::from_millis(1));
        std::thread::spawn(|| {
            record("other", Duration::from_millis(1));
            assert_eq!(summary(), "other=1.00");
        })
        .join()
        .unwrap();
        assert_eq!(summary(), "main=1.00");
    }
}
