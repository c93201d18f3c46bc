//! Figures of a running process read from `/proc`.

/// `VmRSS` and `VmHWM` (peak) of process `pid`, KiB; 0 for what cannot be read.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let (rss, peak) = super::rss_kib(std::process::id());
        assert!(rss > 0 && peak >= rss, "{rss} {peak}");
        assert_eq!(super::rss_kib(u32::MAX), (0, 0));
    }
}
