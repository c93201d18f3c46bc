//! Running the cases of a `harness = false` test target one after the other: each case is
//! reported, a panic or error fails that case only, and [`Suite::finish`] gives the exit code.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::Instant;

use super::bins::{self, K8sBins};

/// The binaries, or `None` after printing the skip message. Panics (the target fails) when
/// they are missing and `PLEXUS_K8S_REQUIRE` is set, or cannot be unpacked.
pub fn bins_or_skip() -> Option<K8sBins> {
    let missing = bins::missing_tools();
    if !missing.is_empty() {
        let msg = format!(
            "real-cluster tier SKIPPED: not on PATH: {} (Debian: etcd-server, util-linux, xz-utils)",
            missing.join(", ")
        );
        assert!(!bins::required(), "{} is set: {msg}", bins::REQUIRE_ENV);
        eprintln!("{msg}");
        return None;
    }
    match K8sBins::from_env() {
        Ok(Some(b)) => Some(b),
        Ok(None) if bins::required() => panic!(
            "{} is set but {}={:?} does not hold kube-apiserver, kubelet and kubectl",
            bins::REQUIRE_ENV,
            bins::BIN_ENV,
            std::env::var_os(bins::BIN_ENV).unwrap_or_default()
        ),
        Ok(None) => {
            eprintln!("{}", bins::skip_message());
            None
        }
        Err(e) => panic!("Kubernetes binaries: {e:#}"),
    }
}

/// A started control plane for a tier, or `None` after printing the skip message (see
/// [`bins_or_skip`]). Panics (the target fails) when it cannot start.
pub fn control_plane_or_skip() -> Option<super::ControlPlane> {
    let bins = bins_or_skip()?;
    Some(super::ControlPlane::start(&bins).expect("start control plane"))
}

/// [`control_plane_or_skip`] with the Services' `range` (e.g. [`super::SERVICE_RANGE_DUAL`]).
pub fn control_plane_with_service_range_or_skip(range: &str) -> Option<super::ControlPlane> {
    let bins = bins_or_skip()?;
    Some(super::ControlPlane::start_with_service_range(&bins, range).expect("start control plane"))
}

/// The tier's setup, or `None` after printing why it failed, with the API server's last log
/// lines (the tier then exits with a failure).
pub fn setup_or_report<T>(
    tier: &str,
    cp: &super::ControlPlane,
    setup: anyhow::Result<T>,
) -> Option<T> {
    match setup {
        Ok(t) => Some(t),
        Err(e) => {
            eprintln!(
                "{tier} setup failed: {e:#}\n{}",
                super::tail(&cp.apiserver_log(), 30)
            );
            None
        }
    }
}

/// The libtest-style arguments of a `harness = false` target (`cargo test -- NAME --skip X`):
/// the first positional argument filters case names by substring, each `--skip X` leaves out
/// the names containing `X`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CliArgs {
    /// The name filter.
    pub filter: Option<String>,
    /// The `--skip` values.
    pub skips: Vec<String>,
}

/// libtest options that take a value (their value is not a name filter).
const VALUE_FLAGS: &[&str] = &[
    "--skip",
    "--test-threads",
    "--logfile",
    "--color",
    "--format",
    "--shuffle-seed",
    "-Z",
];

impl CliArgs {
    /// Parses the arguments after the program name.
    pub fn parse(args: impl IntoIterator<Item = String>) -> CliArgs {
        let mut out = CliArgs::default();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            if a == "--skip" {
                out.skips.extend(it.next());
            } else if VALUE_FLAGS.contains(&a.as_str()) {
                it.next();
            } else if let Some(v) = a.strip_prefix("--skip=") {
                out.skips.push(v.to_string());
            } else if !a.starts_with('-') && out.filter.is_none() {
                out.filter = Some(a);
            }
        }
        out
    }

    /// This process' arguments.
    pub fn from_env() -> CliArgs {
        CliArgs::parse(std::env::args().skip(1))
    }

    /// Whether case `name` is selected.
    pub fn selects(&self, name: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| name.contains(f))
            && !self.skips.iter().any(|s| name.contains(s.as_str()))
    }
}

/// Sequential cases with a summary.
pub struct Suite {
    name: String,
    args: CliArgs,
    passed: Vec<String>,
    failed: Vec<String>,
}

impl Suite {
    /// A suite; the command line selects cases as [`CliArgs`] says (as `cargo test --test X --
    /// NAME` does for libtest targets).
    pub fn new(name: &str) -> Suite {
        Suite {
            name: name.to_string(),
            args: CliArgs::from_env(),
            passed: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Whether case `name` is selected by the filter.
    pub fn selected(&self, name: &str) -> bool {
        self.args.selects(name)
    }

    /// Run one case; an `Err` or a panic fails it.
    pub fn case(&mut self, name: &str, f: impl FnOnce() -> anyhow::Result<()>) {
        if !self.selected(name) {
            return;
        }
        println!("test {} ... ", name);
        let t0 = Instant::now();
        let res = catch_unwind(AssertUnwindSafe(f));
        let secs = t0.elapsed().as_secs_f64();
        match res {
            Ok(Ok(())) => {
                println!("test {name} ... ok ({secs:.2} s)");
                self.passed.push(name.to_string());
            }
            Ok(Err(e)) => {
                println!("test {name} ... FAILED ({secs:.2} s): {e:#}");
                self.failed.push(name.to_string());
            }
            Err(_) => {
                println!("test {name} ... FAILED ({secs:.2} s): panicked (see above)");
                self.failed.push(name.to_string());
            }
        }
    }

    /// Whether any case failed so far.
    pub fn any_failed(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Print the summary; failure when any case failed.
    pub fn finish(self) -> ExitCode {
        println!(
            "\n{}: {} passed, {} failed",
            self.name,
            self.passed.len(),
            self.failed.len()
        );
        for f in &self.failed {
            println!("    FAILED: {f}");
        }
        if self.failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CliArgs;

    fn parse(a: &[&str]) -> CliArgs {
        CliArgs::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn skip_values_are_not_filters() {
        let a = parse(&["--skip", "vm_sriov", "--test-threads", "2", "calico/burst"]);
        assert_eq!(a.filter.as_deref(), Some("calico/burst"));
        assert_eq!(a.skips, vec!["vm_sriov".to_string()]);
        assert!(a.selects("calico/burst_of_20"));
        assert!(!a.selects("flannel/burst_of_20"));
        let a = parse(&["--skip=timings", "--nocapture"]);
        assert_eq!(a.filter, None);
        assert!(a.selects("flannel/burst_of_20"));
        assert!(!a.selects("flannel/timings_with_plexus"));
    }
}
