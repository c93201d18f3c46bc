//! Child processes in their own process group, killed (whole group) on drop. They also get
//! `SIGKILL` when the thread that started them dies (`setpriv --pdeathsig`), so a test
//! process killed outright leaves nothing running: start them from the main thread.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// A running process group.
pub struct Proc {
    name: String,
    child: Option<Child>,
}

impl Proc {
    /// Start `program args…` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> Result<Proc> {
        Proc::spawn_with(name, program, args, log, |_| {})
    }

    /// [`Proc::spawn`], with `setup` adjusting the command first (environment, a `pre_exec`).
    pub fn spawn_with(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        setup: impl FnOnce(&mut Command),
    ) -> Result<Proc> {
        use std::os::unix::process::CommandExt;
        let out = File::options().create(true).append(true).open(log)?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        setup(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {name} ({})", program.display()))?;
        Ok(Proc {
            name: name.to_string(),
            child: Some(child),
        })
    }

    /// The process (and group) id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it is still running (an error names it and its exit status).
    pub fn check_alive(&mut self) -> Result<()> {
        let name = self.name.clone();
        let child = self.child.as_mut().context("not started")?;
        match child.try_wait()? {
            None => Ok(()),
            Some(st) => anyhow::bail!("{name} exited: {st}"),
        }
    }

    /// `SIGKILL` to the group at once (a crash, an OOM kill), then wait for the leader.
    pub fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
        let _ = child.wait();
    }

    /// `SIGTERM` to the leader alone, `SIGKILL` to it after `grace`; its children (a CNI
    /// plugin containerd is running) go on, as under systemd's `KillMode=process`.
    pub fn stop_leader(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        let _ = child.wait();
    }

    /// `SIGTERM` to the group, `SIGKILL` after `grace`; waits for the leader.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = Pid::from_raw(child.id() as i32);
        let _ = killpg(pgid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Whatever is left in the group (also children of an exited leader).
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}
