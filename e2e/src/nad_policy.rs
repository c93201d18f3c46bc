//! The plexus `nadPolicy` the tests run under.

use std::path::Path;

/// A `nadPolicy` whose `paths` classes (`data`, `logs`, `config`, `sockets`) all list `dirs`
/// and nothing else. The tests' NADs keep their state (host-local's `dataDir`, log files) in
/// the test's own directory rather than the node's defaults (`/var/lib/cni/networks`,
/// `/var/log/cni`…), so a test's plexus config lists that directory here, as an operator lists
/// the directories its plugins use: the policy stays enforced, and a NAD path outside `dirs`
/// is still refused. Each entry must be absolute and not writable by every user (the node
/// ignores such a directory): a per-test temporary directory (mode 0700), never `/tmp` itself.
pub fn nad_policy_allowing(dirs: &[&Path]) -> serde_json::Value {
    let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    serde_json::json!({"paths": {"data": dirs, "logs": dirs, "config": dirs, "sockets": dirs}})
}
