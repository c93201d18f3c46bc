//! One CNI call's outcome, for the metrics both modes export (docs/metrics.md).
//!
//! The code paths report what happened through [`sink`]: an API request ([`api_request`]), a
//! delegate exec (through [`plexus_delegates::timing::delegate_done`]), an address-claim
//! conflict or takeover, a NAD-policy refusal, a status write given up. Where that goes depends
//! on the mode:
//! - daemon mode installs its registry as the [`Sink`] ([`install`]): every event is counted
//!   at once, whichever thread it happens on;
//! - thin mode installs nothing: the events fill this process' [`Outcome`], which the call
//!   ends by appending as ONE line to `<cniDir>/metrics/outcomes.jsonl` ([`append`]), with a
//!   single `write(2)` on an `O_APPEND` file; `plexus-daemon reconcile --metrics-address`
//!   makes that directory and reads the lines into the same registry
//!   (`daemon::metrics::tail`). Without the directory (no exporter) a call records nothing.
//!
//! Nothing here links the Prometheus client: the thin `plexus` binary stays small.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The file thin calls append to, in the metrics directory.
pub const FILE_NAME: &str = "outcomes.jsonl";

/// Past this size a thin call stops appending (no exporter rotates the file): the file stays
/// bounded on a node that runs no exporter. The exporter rotates at a quarter of it.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// The format version of a line (`f`); lines of another version are skipped by the exporter.
pub const FORMAT: u32 = 1;

/// Delegate execs one outcome keeps (a call runs a few; the rest are dropped).
const MAX_DELEGATES: usize = 256;

/// A delegate exec: (verb, plugin type, seconds, ok).
pub type DelegateExec = (String, String, f64, bool);
/// API requests: (verb, resource, code, how many).
pub type ApiCount = (String, String, String, u32);

/// What one call did, as the metrics count it. Serialized as one JSON line with short keys.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Line format ([`FORMAT`]).
    #[serde(rename = "f", default)]
    pub format: u32,
    /// `ADD`, `DEL`, `CHECK`, `STATUS`, `GC`.
    #[serde(rename = "v")]
    pub verb: String,
    /// `ok`, `error` or `busy`.
    #[serde(rename = "r")]
    pub result: String,
    /// The CNI error code; 0 when ok.
    #[serde(rename = "c", default)]
    pub code: u32,
    /// The whole call, seconds.
    #[serde(rename = "s", default)]
    pub seconds: f64,
    /// Per phase (the closing log line's `phases=`), seconds.
    #[serde(rename = "p", default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<(String, f64)>,
    /// Each delegate exec.
    #[serde(rename = "d", default, skip_serializing_if = "Vec::is_empty")]
    pub delegates: Vec<DelegateExec>,
    /// API requests by verb, resource and code.
    #[serde(rename = "a", default, skip_serializing_if = "Vec::is_empty")]
    pub api: Vec<ApiCount>,
    /// ADDs refused because another pod holds an address.
    #[serde(rename = "cc", default, skip_serializing_if = "is_zero")]
    pub claim_conflicts: u32,
    /// Stale address claims taken over.
    #[serde(rename = "ct", default, skip_serializing_if = "is_zero")]
    pub claim_takeovers: u32,
    /// NAD-policy refusals by class.
    #[serde(rename = "n", default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<(String, u32)>,
    /// Status writes abandoned after their retries.
    #[serde(rename = "g", default, skip_serializing_if = "is_zero")]
    pub status_given_up: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where the code paths report events (see the module doc).
pub trait Sink: Send + Sync {
    /// An API request was answered with HTTP `code` (or `"error"`: no answer).
    fn api_request(&self, verb: &str, resource: &str, code: &str);
    /// A delegate exec finished.
    fn delegate(&self, verb: &str, plugin_type: &str, took: Duration, ok: bool);
    /// An ADD was refused: an address it wants is another pod's.
    fn claim_conflict(&self);
    /// A stale address claim (its pod gone) was taken over.
    fn claim_takeover(&self);
    /// A NAD was refused by the node's policy (`class`: [`refusal_class`]'s names).
    fn policy_refusal(&self, class: &str);
    /// A network-status write was abandoned after its retries.
    fn status_given_up(&self);
}

impl Sink for Mutex<Outcome> {
    fn api_request(&self, verb: &str, resource: &str, code: &str) {
        let mut o = self.lock().unwrap_or_else(|p| p.into_inner());
        match o
            .api
            .iter_mut()
            .find(|a| a.0 == verb && a.1 == resource && a.2 == code)
        {
            Some(a) => a.3 += 1,
            None => o.api.push((verb.into(), resource.into(), code.into(), 1)),
        }
    }
    fn delegate(&self, verb: &str, plugin_type: &str, took: Duration, ok: bool) {
        let mut o = self.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded for a long-lived process that installed no sink.
        if o.delegates.len() < MAX_DELEGATES {
            o.delegates
                .push((verb.into(), plugin_type.into(), took.as_secs_f64(), ok));
        }
    }
    fn claim_conflict(&self) {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .claim_conflicts += 1;
    }
    fn claim_takeover(&self) {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .claim_takeovers += 1;
    }
    fn policy_refusal(&self, class: &str) {
        let mut o = self.lock().unwrap_or_else(|p| p.into_inner());
        match o.refusals.iter_mut().find(|r| r.0 == class) {
            Some(r) => r.1 += 1,
            None => o.refusals.push((class.into(), 1)),
        }
    }
    fn status_given_up(&self) {
        self.lock()
            .unwrap_or_else(|p| p.into_inner())
            .status_given_up += 1;
    }
}

static INSTALLED: OnceLock<Arc<dyn Sink>> = OnceLock::new();

fn pending() -> &'static Mutex<Outcome> {
    static P: OnceLock<Mutex<Outcome>> = OnceLock::new();
    P.get_or_init(Default::default)
}

fn delegate_hook(verb: &str, plugin_type: &str, took: Duration, ok: bool) {
    sink().delegate(verb, bounded_type(plugin_type), took, ok);
}

/// Route the delegates' exec reports here (idempotent; both modes call it at start).
pub fn hook_delegates() {
    plexus_delegates::timing::set_delegate_hook(delegate_hook);
}

/// Daemon mode: count every event in `s` from now on (the first call wins).
pub fn install(s: Arc<dyn Sink>) {
    let _ = INSTALLED.set(s);
    hook_delegates();
}

/// Where events go now: the installed sink, else this process' [`Outcome`].
pub fn sink() -> &'static dyn Sink {
    match INSTALLED.get() {
        Some(s) => &**s,
        None => pending(),
    }
}

/// A delegate type as a label: its binary's name (a file found in `CNI_PATH`), or `other`
/// for a name no plugin file could have.
pub fn bounded_type(t: &str) -> &str {
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        t
    } else {
        "other"
    }
}

/// Report an API request (see [`Sink::api_request`]).
pub fn api_request(verb: &str, resource: &str, code: &str) {
    sink().api_request(verb, resource, code);
}

/// The metrics' class of a NAD-policy refusal: `path_<class>` for a host path
/// (`path_data`, `path_logs`, `path_config`, `path_sockets`, `path_other`), `host_<kind>` for a
/// host resource (`host_interfaces`, `host_vlans`, `host_resourceNames`, `host_devices`).
pub fn refusal_class(part: &str, class: &str) -> String {
    format!("{part}_{class}")
}

/// Thin mode: this call's outcome so far, completed with its verb, result, code, duration and
/// phases (the record is emptied for a next call in this process).
pub fn take(verb: &str, code: Option<u32>, took: Duration) -> Outcome {
    let mut o = std::mem::take(&mut *pending().lock().unwrap_or_else(|p| p.into_inner()));
    o.format = FORMAT;
    o.verb = verb.to_string();
    (o.result, o.code) = match code {
        None => ("ok".into(), 0),
        Some(c) => ("error".into(), c),
    };
    o.seconds = took.as_secs_f64();
    o.phases = plexus_delegates::timing::phases()
        .into_iter()
        .map(|(n, d)| (n.to_string(), d.as_secs_f64()))
        .collect();
    o
}

/// The metrics directory of a `cniDir`.
pub fn dir_of(cni_dir: &Path) -> PathBuf {
    cni_dir.join("metrics")
}

/// Append `o` as one line to `dir/outcomes.jsonl` (file 0600, created when missing) with one
/// `write(2)`. `Ok(false)`: `dir` does not exist — no exporter made it (it does at start), so
/// nothing is recorded. Never fails the call: a problem is returned for the caller to log
/// (thin mode runs one call per process, so at most once per call).
pub fn append(dir: &Path, o: &Outcome) -> Result<bool, String> {
    let path = dir.join(FILE_NAME);
    let opened = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path);
    let mut f = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    if size >= MAX_FILE_BYTES {
        return Err(format!(
            "{}: {size} bytes, the exporter is not reading it: call outcomes are not recorded",
            path.display()
        ));
    }
    let mut line = serde_json::to_vec(o).map_err(|e| e.to_string())?;
    line.push(b'\n');
    f.write_all(&line)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(true)
}

/// The exporter: make the metrics directory (0700), which turns the calls' recording on.
pub fn make_dir(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))
}

/// Parse one line; `None` for a line that is not an outcome of this [`FORMAT`].
pub fn parse(line: &[u8]) -> Option<Outcome> {
    let o: Outcome = serde_json::from_slice(line).ok()?;
    (o.format == FORMAT).then_some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_outcome_collects_events_and_round_trips_as_one_line() {
        let p = Mutex::new(Outcome::default());
        p.api_request("get", "pods", "200");
        p.api_request("get", "pods", "200");
        p.api_request("patch", "pods", "403");
        p.delegate("ADD", "bridge", Duration::from_millis(5), true);
        p.claim_conflict();
        p.claim_takeover();
        p.policy_refusal("path_logs");
        p.policy_refusal("path_logs");
        p.status_given_up();
        let mut o = p.into_inner().unwrap();
        o.format = FORMAT;
        o.verb = "ADD".into();
        o.result = "error".into();
        o.code = 11;
        assert_eq!(
            o.api,
            vec![
                ("get".into(), "pods".into(), "200".into(), 2),
                ("patch".into(), "pods".into(), "403".into(), 1)
            ]
        );
        assert_eq!(o.refusals, vec![("path_logs".into(), 2)]);
        let line = serde_json::to_vec(&o).unwrap();
        assert!(!line.contains(&b'\n'));
        assert_eq!(parse(&line), Some(o));
        assert_eq!(parse(b"{\"f\":99,\"v\":\"ADD\",\"r\":\"ok\"}"), None);
        assert_eq!(parse(b"garbage"), None);
    }

    #[test]
    fn append_adds_one_line_per_call_once_the_exporter_made_the_dir() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("metrics");
        let o = Outcome {
            format: FORMAT,
            verb: "DEL".into(),
            result: "ok".into(),
            ..Default::default()
        };
        assert_eq!(append(&dir, &o), Ok(false));
        assert!(!dir.exists(), "a call does not make the directory");
        make_dir(&dir).unwrap();
        assert_eq!(append(&dir, &o), Ok(true));
        assert_eq!(append(&dir, &o), Ok(true));
        let text = std::fs::read_to_string(dir.join(FILE_NAME)).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.lines().all(|l| parse(l.as_bytes()) == Some(o.clone())));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(FILE_NAME)), 0o600);
    }

    #[test]
    fn a_full_file_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(t.path().join(FILE_NAME)).unwrap();
        f.set_len(MAX_FILE_BYTES).unwrap();
        let e = append(t.path(), &Outcome::default()).unwrap_err();
        assert!(e.contains("not reading it"), "{e}");
        assert_eq!(
            std::fs::metadata(t.path().join(FILE_NAME)).unwrap().len(),
            MAX_FILE_BYTES
        );
    }

    /// `cargo test --release -p plexus-meta --lib outcome::tests::cost -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement"]
    fn cost_of_the_write_path() {
        let t = tempfile::tempdir().unwrap();
        let p = Mutex::new(Outcome::default());
        for (v, r) in [("get", "pods"), ("get", "network-attachment-definitions")] {
            p.api_request(v, r, "200");
        }
        p.api_request("patch", "pods", "200");
        p.api_request("create", "events", "201");
        for ty in ["bridge", "macvlan", "sriov"] {
            p.delegate("ADD", ty, Duration::from_millis(12), true);
        }
        let mut o = p.into_inner().unwrap();
        o.format = FORMAT;
        o.verb = "ADD".into();
        o.result = "ok".into();
        o.phases = [
            "config",
            "args",
            "lock",
            "pod_get",
            "nad_get",
            "nad_policy",
            "plan",
        ]
        .iter()
        .chain(["plan_save", "delegates", "status_patch", "event"].iter())
        .map(|n| (n.to_string(), 0.001234))
        .collect();
        let n = 2000;
        let started = std::time::Instant::now();
        for _ in 0..n {
            assert_eq!(append(t.path(), &o), Ok(true));
        }
        let len = serde_json::to_vec(&o).unwrap().len() + 1;
        println!(
            "outcome write path: {:.1} us per call ({n} appends of a {len}-byte line)",
            started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
        let started = std::time::Instant::now();
        for _ in 0..n {
            assert_eq!(append(&t.path().join("absent"), &o), Ok(false));
        }
        println!(
            "without the metrics dir: {:.1} us per call",
            started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
        );
    }

    #[test]
    fn delegate_types_are_bounded() {
        assert_eq!(bounded_type("host-device"), "host-device");
        assert_eq!(bounded_type("a/b"), "other");
        assert_eq!(bounded_type(&"x".repeat(65)), "other");
        assert_eq!(bounded_type(""), "other");
    }
}
