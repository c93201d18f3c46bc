//! Exec credential plugins (a kubeconfig user's `exec`): run one non-interactively, within a
//! time limit, and read the token or client certificate of the `ExecCredential` it prints.

use std::process::{Command, Stdio};
use std::time::Duration;

use kube::config::ExecConfig;

/// Why no credential came from the plugin.
#[derive(Debug)]
pub(super) struct ExecFailure {
    /// What failed, never containing the plugin's output on stdout (the credential).
    pub reason: String,
    /// The plugin may succeed on the next call (it timed out or exited non-zero).
    pub transient: bool,
}

impl From<String> for ExecFailure {
    fn from(reason: String) -> Self {
        ExecFailure {
            reason,
            transient: false,
        }
    }
}

impl From<&str> for ExecFailure {
    fn from(reason: &str) -> Self {
        reason.to_owned().into()
    }
}

/// What an exec credential plugin gave.
pub(super) struct ExecCredential {
    /// A bearer token.
    pub token: Option<String>,
    /// A client certificate and key, PEM.
    pub client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

/// Run an exec credential plugin, never interactively (a CNI call has no terminal).
///
/// A plugin that times out or exits non-zero is transient (its credential source — a cloud
/// token service, a vault — may answer on the next call); one that cannot be started or prints
/// no usable credential is a kubeconfig problem.
/// `cluster` is the `spec.cluster` to pass, for a plugin with `provideClusterInfo`.
pub(super) fn run_exec(
    exec: &ExecConfig,
    cluster: Option<serde_json::Value>,
) -> Result<ExecCredential, ExecFailure> {
    let command = exec
        .command
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or("exec credential plugin without a command")?;
    let api_version = exec
        .api_version
        .as_deref()
        .unwrap_or("client.authentication.k8s.io/v1");
    let mut spec = serde_json::json!({"interactive": false});
    if let Some(cluster) = cluster {
        spec["cluster"] = cluster;
    }
    let info = serde_json::json!({
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "spec": spec,
    });
    let mut cmd = Command::new(command);
    cmd.args(exec.args.iter().flatten())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("KUBERNETES_EXEC_INFO", info.to_string());
    for pair in exec.env.iter().flatten() {
        if let (Some(name), Some(value)) = (pair.get("name"), pair.get("value")) {
            cmd.env(name, value);
        }
    }
    for name in exec.drop_env.iter().flatten() {
        cmd.env_remove(name);
    }
    // A killed plexus must not leave its credential plugin running.
    plexus_delegates::exec::die_with_parent(&mut cmd);
    let out = output_within(cmd, EXEC_TIMEOUT).map_err(|e| ExecFailure {
        reason: format!("exec credential plugin {command}: {e}"),
        transient: e.kind() == std::io::ErrorKind::TimedOut,
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let first = stderr.lines().next().unwrap_or("").chars().take(200);
        return Err(ExecFailure {
            reason: format!(
                "exec credential plugin {command} failed ({}): {}",
                out.status,
                first.collect::<String>()
            ),
            transient: true,
        });
    }
    // The output holds the credential: its parse error is not echoed.
    let cred: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|_| format!("exec credential plugin {command} printed no ExecCredential"))?;
    let status = &cred["status"];
    let text = |k: &str| {
        status[k]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let token = text("token");
    let client_pem = match (text("clientCertificateData"), text("clientKeyData")) {
        (Some(c), Some(k)) => Some((c.into_bytes(), k.into_bytes())),
        _ => None,
    };
    if token.is_none() && client_pem.is_none() {
        return Err(format!(
            "exec credential plugin {command} gave neither a token nor a client certificate"
        )
        .into());
    }
    Ok(ExecCredential { token, client_pem })
}

/// How long an exec credential plugin may run: a CNI call cannot wait for ever.
const EXEC_TIMEOUT: Duration = Duration::from_secs(10);

/// `cmd`'s exit status and output, killing it after `timeout`.
fn output_within(mut cmd: Command, timeout: Duration) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    let mut child = cmd.spawn()?;
    // Drain both pipes while waiting, so a chatty plugin cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(1 << 20).read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {timeout:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_plugin_that_hangs_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("slow.sh");
        std::fs::write(&script, "#!/bin/sh\nsleep 30\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
        let mut cmd = Command::new(&script);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let start = std::time::Instant::now();
        let err = output_within(cmd, Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}
