//! What containerd's own log says about pod sandboxes: how long `RunPodSandbox` took (it runs the
//! CNI ADD) and how long from `StopPodSandbox` to "TearDown network … successfully" (the CNI
//! DEL). These isolate the runtime path from the kubelet's and the apiserver's delays.

use std::collections::BTreeMap;

/// Seconds of the day of a containerd log line (`time="…T12:34:56.789Z"`).
fn time_of(line: &str) -> Option<f64> {
    let t = line.split("time=\"").nth(1)?.split('"').next()?;
    let hms = t.split('T').nth(1)?.trim_end_matches('Z');
    let mut it = hms.split(':');
    let (h, m, s) = (it.next()?, it.next()?, it.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// The quoted sandbox ID after `marker` (`\"<id>\"`).
fn id_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    line.split(marker).nth(1)?.split("\\\"").next()
}

/// For pods whose name starts with `prefix`: (`RunPodSandbox` ms, teardown ms), one per pod.
pub fn sandbox_times(log: &str, prefix: &str) -> (Vec<f64>, Vec<f64>) {
    let mut started: BTreeMap<String, f64> = BTreeMap::new();
    let mut pod_of: BTreeMap<String, String> = BTreeMap::new();
    let mut run = Vec::new();
    let mut stop: BTreeMap<String, f64> = BTreeMap::new();
    let mut teardown = Vec::new();
    for line in log.lines() {
        let Some(t) = time_of(line) else { continue };
        if let Some(rest) = line
            .split("RunPodSandbox for &PodSandboxMetadata{Name:")
            .nth(1)
        {
            let name = rest.split(',').next().unwrap_or("").to_string();
            if !name.starts_with(prefix) {
                continue;
            }
            match id_after(line, "returns sandbox id \\\"") {
                Some(id) => {
                    if let Some(t0) = started.remove(&name) {
                        run.push((t - t0) * 1000.0);
                    }
                    pod_of.insert(id.to_string(), name);
                }
                None => {
                    started.insert(name, t);
                }
            }
        } else if let Some(id) = id_after(line, "msg=\"StopPodSandbox for \\\"") {
            if pod_of.contains_key(id) && line.ends_with("\\\"\"") {
                stop.entry(id.to_string()).or_insert(t);
            }
        } else if let Some(id) = id_after(line, "TearDown network for sandbox \\\"") {
            if let Some(t0) = stop.get(id) {
                if line.contains("successfully") && pod_of.remove(id).is_some() {
                    teardown.push((t - t0) * 1000.0);
                }
            }
        }
    }
    (run, teardown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_run_and_teardown_lines_of_one_pod() {
        let log = r#"time="2026-11-23T14:30:03.000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:bare-s1,Uid:u,Namespace:app,Attempt:0,}"
time="2026-11-23T14:30:03.400Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:bare-s1,Uid:u,Namespace:app,Attempt:0,} returns sandbox id \"abc\""
time="2026-11-23T14:30:05.000Z" level=info msg="StopPodSandbox for \"abc\""
time="2026-11-23T14:30:05.150Z" level=info msg="TearDown network for sandbox \"abc\" successfully"
time="2026-11-23T14:30:05.151Z" level=info msg="StopPodSandbox for \"abc\" returns successfully"
time="2026-11-23T14:30:06.000Z" level=info msg="StopPodSandbox for \"abc\""
"#;
        let (run, td) = sandbox_times(log, "bare-s");
        assert_eq!(run.len(), 1);
        assert!((run[0] - 400.0).abs() < 0.01, "{run:?}");
        assert_eq!(td.len(), 1);
        assert!((td[0] - 150.0).abs() < 0.01, "{td:?}");
        assert_eq!(sandbox_times(log, "plexus-s"), (vec![], vec![]));
    }
}
