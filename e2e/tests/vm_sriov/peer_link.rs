//! The first VM's commands to the second node, as files in the second node's out directory
//! (`<first VM's out>/peer` on the host, shared with both VMs over 9p, uncached): the first VM
//! writes `cmd-<n>.json` (renamed into place whole), the second node carries it out and writes
//! `done-<n>.json` (`{"ok": true, ...}` or `{"ok": false, "error"}`). Commands are numbered from
//! 1 and carried out in order; `{"op":"stop"}` ends the second node (its VM powers off, giving
//! its CPU back to the cases after). Polling costs a guest CPU under TCG (each look is a 9p
//! round trip): the second node looks every 10 ms for 30 s after a command, then every 500 ms.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The next command's number (the first VM's side).
static NEXT: AtomicU32 = AtomicU32::new(1);

/// The shared directory, seen from the first VM.
fn shared() -> PathBuf {
    PathBuf::from(std::env::var("PLEXUS_VM_OUT").unwrap_or_else(|_| "/tmp".into())).join("peer")
}

/// Send `cmd` to the second node and wait up to `limit` for its answer.
pub fn send(cmd: &Value, limit: Duration) -> Result<Value, String> {
    let n = post(cmd)?;
    wait(n, limit)
}

/// Send `cmd` without waiting; its number, for [`wait`].
pub fn post(cmd: &Value) -> Result<u32, String> {
    let dir = shared();
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let tmp = dir.join(format!(".cmd-{n}.json"));
    std::fs::write(&tmp, cmd.to_string()).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dir.join(format!("cmd-{n}.json"))).map_err(|e| e.to_string())?;
    Ok(n)
}

/// Wait up to `limit` for the answer to command `n`.
pub fn wait(n: u32, limit: Duration) -> Result<Value, String> {
    let done = shared().join(format!("done-{n}.json"));
    let t = Instant::now();
    loop {
        if let Some(v) = read_json(&done) {
            return if v["ok"] == true {
                Ok(v)
            } else {
                Err(format!("the second node: {}", v["error"]))
            };
        }
        if t.elapsed() > limit {
            return Err(format!(
                "the second node did not answer command {n} within {limit:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Send the second node `{"op":"stop"}`: it answers, then its VM powers off.
pub fn stop() -> Result<(), String> {
    send(&json!({"op": "stop"}), Duration::from_secs(30)).map(|_| ())
}

/// The second node's side: carry out each command in `out` with `f` until `stop`.
pub fn serve(out: &Path, mut f: impl FnMut(&Value) -> Result<Value, String>) -> i32 {
    let mut n = 1u32;
    let mut last = Instant::now();
    loop {
        let Some(cmd) = read_json(&out.join(format!("cmd-{n}.json"))) else {
            let idle = last.elapsed() > Duration::from_secs(30);
            std::thread::sleep(Duration::from_millis(if idle { 500 } else { 10 }));
            continue;
        };
        last = Instant::now();
        let stop = cmd["op"] == "stop";
        let answer = match if stop { Ok(json!({})) } else { f(&cmd) } {
            Ok(mut v) => {
                v["ok"] = json!(true);
                v
            }
            Err(e) => json!({"ok": false, "error": e}),
        };
        println!("vm-peer: {cmd} → {answer}");
        let tmp = out.join(format!(".done-{n}.json"));
        if std::fs::write(&tmp, answer.to_string()).is_ok() {
            let _ = std::fs::rename(&tmp, out.join(format!("done-{n}.json")));
        }
        if stop {
            return 0;
        }
        n += 1;
    }
}

fn read_json(p: &Path) -> Option<Value> {
    let s = std::fs::read_to_string(p).ok()?;
    serde_json::from_str(&s).ok()
}
