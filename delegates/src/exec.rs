//! Finding a plugin binary in the search path and executing it with the CNI protocol: the
//! environment, the config on stdin, a deadline, and the result or error on stdout.

use plexus_conf::error::{code, CniError};
use plexus_conf::limits;
use plexus_conf::validate;
use serde_json::Value;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a pipe holds before a write blocks (Linux' default pipe size): a config up to this size
/// is written to the plugin's stdin without a thread.
const PIPE_BUFFER: usize = 64 * 1024;

/// The CNI verb passed in `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// ADD
    Add,
    /// DEL
    Del,
    /// CHECK
    Check,
    /// STATUS
    Status,
    /// GC
    Gc,
    /// VERSION
    Version,
}

impl Verb {
    /// The `CNI_COMMAND` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Add => "ADD",
            Verb::Del => "DEL",
            Verb::Check => "CHECK",
            Verb::Status => "STATUS",
            Verb::Gc => "GC",
            Verb::Version => "VERSION",
        }
    }
}

/// The per-call CNI environment for a plugin invocation.
#[derive(Debug, Clone, Default)]
pub struct CniEnv {
    /// `CNI_CONTAINERID`
    pub container_id: String,
    /// `CNI_NETNS`
    pub netns: String,
    /// `CNI_IFNAME`
    pub ifname: String,
    /// `CNI_ARGS`
    pub args: String,
    /// `CNI_PATH` entries.
    pub path: Vec<PathBuf>,
}

/// Find the binary for plugin `plugin_type` in `dirs` (first match wins). The name must be bare:
/// a `/` or `..` would escape the plugin directories.
pub fn find_plugin(plugin_type: &str, dirs: &[PathBuf]) -> Result<PathBuf, CniError> {
    validate::plugin_type(plugin_type)?;
    let _phase = crate::timing::phase("plugin_lookup");
    for dir in dirs {
        let candidate = dir.join(plugin_type);
        if let Ok(meta) = crate::hostroot::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(CniError::new(
        code::INVALID_CONFIG,
        format!("failed to find plugin {plugin_type:?}"),
        format!(
            "searched [{}]",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// What a finished plugin printed.
#[derive(Debug)]
struct Finished {
    success: bool,
    /// How it ended, for messages: `exit status 1`, `signal 11 (SIGSEGV)`…
    status: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

/// Run `binary` with `verb`, `env` and `stdin`, and return its parsed stdout (`None` when it
/// printed nothing). A plugin error is returned with its own code; the message names the plugin
/// and verb. The plugin runs in its own process group, killed whole at the deadline.
pub fn exec_plugin(
    binary: &Path,
    verb: Verb,
    env: &CniEnv,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Option<Value>, CniError> {
    let name = binary
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ctx = format!("plugin {name} {}", verb.as_str());
    let started = Instant::now();
    let _phase = crate::timing::phase("delegates");
    let finished = run(binary, verb, env, stdin, timeout);
    crate::timing::delegate_done(
        verb.as_str(),
        &name,
        started.elapsed(),
        finished.as_ref().is_ok_and(|f| f.success),
    );
    let finished = finished.map_err(|e| e.context(&ctx))?;
    tracing::debug!(plugin = %name, verb = verb.as_str(), ifname = %env.ifname,
        elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, ok = finished.success, "delegate finished");
    if !finished.stderr.is_empty() {
        let text = String::from_utf8_lossy(&finished.stderr);
        tracing::debug!(plugin = %name, stderr = %text.trim_end(), "delegate stderr");
    }
    let stdout = trim(&finished.stdout);
    if finished.success {
        // Only ADD and VERSION print a result; whatever else a plugin prints on success is noise.
        if stdout.is_empty() || !matches!(verb, Verb::Add | Verb::Version) {
            return Ok(None);
        }
        return serde_json::from_slice(stdout).map(Some).map_err(|e| {
            CniError::decode(
                format!("{ctx}: failed to parse plugin output"),
                format!("{e}; output was {:?}", preview(stdout)),
            )
        });
    }
    // Failure: stdout should hold the error object; fall back to stderr text (libcni RawExec).
    if let Ok(v) = serde_json::from_slice::<Value>(stdout) {
        if let Some(err) = CniError::parse(&v) {
            return Err(err.context(&ctx));
        }
    }
    let stderr = String::from_utf8_lossy(trim(&finished.stderr)).into_owned();
    let details = if !stdout.is_empty() {
        format!(
            "unparsable error output {:?}; stderr: {stderr}",
            preview(stdout)
        )
    } else if stderr.is_empty() {
        format!(
            "the plugin failed without printing an error ({})",
            finished.status
        )
    } else {
        format!("{stderr} ({})", finished.status)
    };
    Err(CniError::new(
        code::DELEGATE_FAILED,
        format!("{ctx}: plugin failed"),
        details,
    ))
}

/// An exit status in words: `exit status 2`, or `signal 11 (SIGSEGV)` for a crash.
fn describe(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(s) => format!("killed by signal {sig} ({})", s.as_str()),
            Err(_) => format!("killed by signal {sig}"),
        },
        (None, None) => "ended".to_string(),
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end]
}

fn preview(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    s.chars().take(200).collect()
}

/// Make the child of `cmd` die (SIGKILL) when plexus dies, so a SIGKILLed plexus cannot leave a
/// delegate running on after the runtime's DEL (its ADD would finish later and leak).
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child ends: callers spawn and
/// wait on the same thread ([`exec_plugin`] returns only after the child has exited or been
/// killed), so a thread's normal end never kills a running child. A parent that died between
/// the fork and the `prctl` is caught by comparing `getppid()` with the pid before the fork.
// `pre_exec` is unsafe by signature; the closure makes only async-signal-safe calls.
#[allow(unsafe_code)]
pub fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other(
                    "plexus exited before the plugin started",
                ));
            }
            Ok(())
        });
    }
}

/// Start the plugin (without a fork: [`crate::spawn`]) in a process group of its own, killed
/// when plexus dies, chrooted into the host root when there is one.
fn spawn(binary: &Path, verb: Verb, env: &CniEnv) -> std::io::Result<crate::spawn::Spawned> {
    let cni_path = std::env::join_paths(&env.path).unwrap_or_default();
    let root = crate::hostroot::get();
    let mut vars: Vec<(&str, &OsStr)> = vec![
        ("CNI_COMMAND", OsStr::new(verb.as_str())),
        ("CNI_CONTAINERID", OsStr::new(&env.container_id)),
        ("CNI_NETNS", OsStr::new(&env.netns)),
        ("CNI_IFNAME", OsStr::new(&env.ifname)),
        ("CNI_ARGS", OsStr::new(&env.args)),
        ("CNI_PATH", &cni_path),
    ];
    if root.is_some() {
        // Inside the host root, the host's PATH.
        vars.push(("PATH", OsStr::new(crate::hostroot::HOST_PATH)));
    }
    let spec = crate::spawn::Spec {
        program: binary,
        env: &vars,
        root,
    };
    // A freshly installed binary can briefly be "text file busy" (libcni retries too).
    let mut attempt = 0;
    loop {
        match crate::spawn::spawn(&spec) {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 5 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(100 * attempt));
            }
            other => return other,
        }
    }
}

fn run(
    binary: &Path,
    verb: Verb,
    env: &CniEnv,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Finished, CniError> {
    let started = Instant::now();
    let child = spawn(binary, verb, env).map_err(|e| {
        CniError::new(
            spawn_failure_code(&e),
            "failed to start plugin",
            format!("{}: {e}", binary.display()),
        )
    })?;
    let pid = child.pid;
    let mut child_stdin = child.stdin;
    // A plugin may exit without reading stdin; a broken pipe is not our error. A config that
    // fits the pipe's buffer is written at once (no thread); a larger one by a thread, so a
    // plugin that never reads cannot block this one past the deadline.
    let writer = if stdin.len() <= PIPE_BUFFER {
        let _ = child_stdin.write_all(stdin);
        drop(child_stdin);
        None
    } else {
        let input = stdin.to_vec();
        Some(std::thread::spawn(move || {
            let _ = child_stdin.write_all(&input);
        }))
    };
    let mut err_pipe = child.stderr;
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // Keep the first MAX_DELEGATE_STDERR_BYTES for the log, drop the rest.
        let _ = (&mut err_pipe)
            .take(limits::MAX_DELEGATE_STDERR_BYTES as u64)
            .read_to_end(&mut buf);
        let _ = std::io::copy(&mut err_pipe, &mut std::io::sink());
        let _ = err_tx.send(buf);
    });
    let (tx, rx) = mpsc::channel();
    let mut out_pipe = child.stdout;
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut oversize = None;
        let cap = limits::MAX_DELEGATE_STDOUT_BYTES;
        let _ = (&mut out_pipe).take(cap as u64 + 1).read_to_end(&mut buf);
        if buf.len() > cap {
            // Over the cap: stop the plugin, count what it had written.
            kill_group(pid as u32);
            let rest = std::io::copy(&mut out_pipe, &mut std::io::sink()).unwrap_or(0);
            oversize = Some(buf.len() + rest as usize);
            buf.clear();
        }
        let status = crate::spawn::wait(pid);
        let _ = tx.send((status, buf, oversize));
    });
    let (status, stdout, oversize) = match rx.recv_timeout(timeout) {
        Ok(v) => v,
        Err(_) => {
            kill_group(pid as u32);
            let _ = rx.recv_timeout(Duration::from_secs(5));
            return Err(CniError::new(
                code::DELEGATE_TIMEOUT,
                "plugin timed out",
                format!(
                    "{} did not finish within {:?} and was killed",
                    binary.display(),
                    timeout
                ),
            ));
        }
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    if let Some(size) = oversize {
        return Err(limits::too_large(
            "plugin output",
            size,
            limits::MAX_DELEGATE_STDOUT_BYTES,
            code::DECODE_FAILURE,
        ));
    }
    // A child of the plugin may keep stderr open: wait for it only until the deadline, then
    // kill the whole group (the plugin itself has exited by now).
    let remaining = timeout.saturating_sub(started.elapsed());
    let stderr = match err_rx.recv_timeout(remaining) {
        Ok(b) => b,
        Err(_) => {
            kill_group(pid as u32);
            err_rx
                .recv_timeout(Duration::from_secs(1))
                .unwrap_or_default()
        }
    };
    let status = status
        .map_err(|e| CniError::new(code::INTERNAL, "failed to wait for plugin", e.to_string()))?;
    Ok(Finished {
        success: status.success(),
        status: describe(&status),
        stdout,
        stderr,
    })
}

/// The code for a plugin that could not be started: 11 (try again later) when the node is
/// short of something for a moment — processes (`EAGAIN`), memory, file descriptors, or the
/// binary is still being written (`ETXTBSY` after the retries) — else 999.
fn spawn_failure_code(e: &std::io::Error) -> u32 {
    match e.raw_os_error() {
        Some(
            libc::EAGAIN | libc::ENOMEM | libc::EMFILE | libc::ENFILE | libc::ETXTBSY | libc::EINTR,
        ) => code::TRY_AGAIN_LATER,
        _ => code::INTERNAL,
    }
}

fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::process::Stdio;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    fn env() -> CniEnv {
        CniEnv {
            container_id: "c1".into(),
            netns: "/run/netns/x".into(),
            ifname: "eth0".into(),
            args: "A=1".into(),
            path: vec!["/nonexistent".into()],
        }
    }

    #[test]
    fn finds_plugins_and_refuses_escapes() {
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let b = t.path().join("b");
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        fs::write(a.join("noexec"), "x").unwrap();
        script(&b, "noexec", "exit 0");
        let dirs = vec![a.clone(), b.clone()];
        assert_eq!(find_plugin("noexec", &dirs).unwrap(), b.join("noexec"));
        let e = find_plugin("missing", &dirs).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("missing") && e.details.contains(&a.display().to_string()));
        assert!(find_plugin("../b/noexec", &dirs).is_err());
        assert!(find_plugin("/bin/sh", &dirs).is_err());
    }

    #[test]
    fn passes_env_and_stdin_and_parses_result() {
        let t = tempfile::tempdir().unwrap();
        let p = script(
            t.path(),
            "echoer",
            r#"in=$(cat); printf '{"cniVersion":"1.0.0","dns":{"domain":"%s|%s|%s|%s|%s|%s"}}' "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$in""#,
        );
        let out = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(out["dns"]["domain"], "ADD|c1|/run/netns/x|eth0|A=1|{}");
    }

    #[test]
    fn plugin_error_keeps_code_and_names_plugin() {
        let t = tempfile::tempdir().unwrap();
        let p = script(
            t.path(),
            "failer",
            r#"echo '{"code":11,"msg":"busy","details":"later"}'; exit 1"#,
        );
        let e = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, 11);
        assert_eq!(e.msg, "plugin failer ADD: busy");
        assert_eq!(e.details, "later");
    }

    #[test]
    fn garbage_output_is_a_decode_error() {
        let t = tempfile::tempdir().unwrap();
        let p = script(t.path(), "garbage", "echo 'hello world'");
        let e = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, code::DECODE_FAILURE);
        assert!(e.msg.contains("garbage") && e.details.contains("hello world"));
        let p = script(
            t.path(),
            "garbage2",
            "echo 'oops' >&2; echo 'not json'; exit 3",
        );
        let e = exec_plugin(&p, Verb::Del, &env(), b"{}", Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, code::DELEGATE_FAILED);
        assert!(e.details.contains("not json") && e.details.contains("oops"));
    }

    #[test]
    fn oversized_output_is_refused_and_the_plugin_stopped() {
        let t = tempfile::tempdir().unwrap();
        let cap = limits::MAX_DELEGATE_STDOUT_BYTES;
        // Exactly cap+1 bytes (head -c), then the plugin would sleep: it must be killed.
        let p = script(
            t.path(),
            "chatty",
            &format!("head -c {} /dev/zero | tr '\\0' x; sleep 30", cap + 1),
        );
        let started = Instant::now();
        let e = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(20)).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed at once"
        );
        assert_eq!(e.code, code::DECODE_FAILURE);
        assert_eq!(e.msg, "plugin chatty ADD: plugin output is too large");
        assert_eq!(
            e.details,
            format!("{} bytes, the limit is {cap} bytes", cap + 1)
        );
        // A long stderr is cut for the log, not an error.
        let p = script(
            t.path(),
            "noisy",
            &format!(
                "head -c {} /dev/zero >&2; echo '{{\"cniVersion\":\"1.0.0\"}}'",
                4 * limits::MAX_DELEGATE_STDERR_BYTES
            ),
        );
        let v = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(20)).unwrap();
        assert_eq!(v.unwrap()["cniVersion"], "1.0.0");
    }

    #[test]
    fn failure_with_only_stderr() {
        let t = tempfile::tempdir().unwrap();
        let p = script(
            t.path(),
            "stderronly",
            "echo 'netplugin exploded' >&2; exit 1",
        );
        let e = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, code::DELEGATE_FAILED);
        assert_eq!(e.details, "netplugin exploded (exit status 1)");
        let p = script(t.path(), "crasher", "kill -SEGV $$");
        let e = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, code::DELEGATE_FAILED);
        assert_eq!(
            e.details,
            "the plugin failed without printing an error (killed by signal 11 (SIGSEGV))"
        );
    }

    #[test]
    fn hanging_plugin_and_its_children_are_killed() {
        let t = tempfile::tempdir().unwrap();
        let marker = t.path().join("child.pid");
        let p = script(
            t.path(),
            "hang",
            &format!("sleep 30 & echo $! > {}; wait", marker.display()),
        );
        let start = Instant::now();
        let e = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.code, code::DELEGATE_TIMEOUT);
        assert!(e.msg.contains("hang"));
        assert!(start.elapsed() < Duration::from_secs(5));
        let child: i32 = fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), None).is_ok()
            && !fs::read_to_string(format!("/proc/{child}/stat"))
                .unwrap_or_default()
                .contains(") Z");
        assert!(!alive, "grandchild {child} survived the timeout");
    }

    #[test]
    fn a_child_holding_stderr_open_does_not_outlive_the_deadline() {
        let t = tempfile::tempdir().unwrap();
        let p = script(
            t.path(),
            "leaky",
            r#"cat >/dev/null; (sleep 30 >/dev/null) & echo '{"cniVersion":"1.0.0"}'"#,
        );
        let start = Instant::now();
        let out = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_millis(500));
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        assert!(out.is_ok(), "{out:?}");
    }

    /// The parent side of [`a_killed_parent_takes_its_delegate_down`]: run a slow plugin (its
    /// script is in `PLEXUS_PDEATHSIG_PLUGIN`) and block in `exec_plugin` until killed.
    #[test]
    fn pdeathsig_parent_helper() {
        let Some(plugin) = std::env::var_os("PLEXUS_PDEATHSIG_PLUGIN") else {
            return; // only run as the helper process
        };
        let _ = exec_plugin(
            Path::new(&plugin),
            Verb::Add,
            &env(),
            b"{}",
            Duration::from_secs(60),
        );
        panic!("the slow plugin finished: the parent was not killed");
    }

    /// A SIGKILLed plexus (here: a helper process blocked in `exec_plugin`) takes the running
    /// delegate down with it instead of leaving it to finish its ADD after the runtime's DEL.
    #[test]
    fn a_killed_parent_takes_its_delegate_down() {
        let t = tempfile::tempdir().unwrap();
        let marker = t.path().join("plugin.pid");
        let p = script(
            t.path(),
            "slow",
            &format!("echo $$ > {}; exec sleep 30", marker.display()),
        );
        let mut helper = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "exec::tests::pdeathsig_parent_helper",
                "--nocapture",
            ])
            .env("PLEXUS_PDEATHSIG_PLUGIN", &p)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let pid: i32 = loop {
            if let Some(pid) = fs::read_to_string(&marker)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the plugin never started");
            std::thread::sleep(Duration::from_millis(20));
        };
        // `exec sleep` keeps the pid: wait until the plugin is sleeping, then kill the parent.
        std::thread::sleep(Duration::from_millis(100));
        helper.kill().unwrap();
        helper.wait().unwrap();
        let alive = |pid: i32| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let survived = alive(pid);
        if survived {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        assert!(!survived, "the delegate {pid} outlived its killed parent");
    }

    /// A start failure the node recovers from (here: the binary is still open for writing, so
    /// exec gives ETXTBSY after every retry) is code 11, not an internal error.
    #[test]
    fn a_transient_start_failure_is_try_again_later() {
        let t = tempfile::tempdir().unwrap();
        let p = script(t.path(), "busy", "exit 0");
        let _writer = fs::OpenOptions::new().write(true).open(&p).unwrap();
        let e = exec_plugin(&p, Verb::Add, &env(), b"{}", Duration::from_secs(5)).unwrap_err();
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e:?}");
        assert_eq!(e.msg, "plugin busy ADD: failed to start plugin");
        assert_eq!(
            spawn_failure_code(&std::io::Error::from_raw_os_error(libc::EAGAIN)),
            code::TRY_AGAIN_LATER
        );
        assert_eq!(
            spawn_failure_code(&std::io::Error::from_raw_os_error(libc::EPERM)),
            code::INTERNAL
        );
    }

    #[test]
    fn empty_success_output_is_none() {
        let t = tempfile::tempdir().unwrap();
        let p = script(t.path(), "quiet", "cat >/dev/null");
        assert!(
            exec_plugin(&p, Verb::Del, &env(), b"{}", Duration::from_secs(5))
                .unwrap()
                .is_none()
        );
    }
}
