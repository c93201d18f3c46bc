//! Starting a delegate without copying plexus: `clone(CLONE_VM | CLONE_VFORK)`, as glibc's
//! `posix_spawn` does, with the few steps a delegate needs between the clone and the exec that
//! `posix_spawn` cannot take: the parent-death signal, a process group of its own, and the
//! chroot into the host root.
//!
//! std's `Command` with a `pre_exec` hook forks: the kernel copies plexus' page tables, and the
//! child's first writes copy pages too. That cost grows with plexus' memory (the daemon's watch
//! caches) and was measured at about 0.9 ms per delegate on a 2-core node. Here the child
//! shares plexus' memory until its `execve`, while the calling thread waits in the kernel.
//!
//! The child runs only async-signal-safe libc calls on memory prepared before the clone, with
//! every signal blocked until its handlers are back at their defaults: no allocation, no lock,
//! no Rust code that could unwind.

#![allow(unsafe_code)]

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

/// What to start.
pub struct Spec<'a> {
    /// The program (an absolute path; no `PATH` search).
    pub program: &'a Path,
    /// Variables set on top of plexus' own environment (a later entry wins).
    pub env: &'a [(&'a str, &'a OsStr)],
    /// A root to `chroot` into (then `chdir /`) before the exec: the host root in a container.
    pub root: Option<&'a Path>,
}

/// A started child: the leader of a process group of its own, with plexus' ends of its stdin,
/// stdout and stderr pipes (close-on-exec, so no later child inherits them).
pub struct Spawned {
    /// Its pid, also its process group id.
    pub pid: i32,
    pub stdin: File,
    pub stdout: File,
    pub stderr: File,
}

/// Everything the child reads, prepared before the clone.
struct ChildArgs {
    program: CString,
    argv: [*const libc::c_char; 2],
    envp: Vec<*const libc::c_char>,
    root: Option<CString>,
    /// The child's stdin, stdout and stderr: the far ends of the three pipes.
    fds: [libc::c_int; 3],
    parent: libc::pid_t,
    /// The errno of the step that failed in the child, 0 while none did.
    failed: AtomicI32,
}

/// Stack of the child until its `execve` (it calls a handful of libc functions).
const CHILD_STACK: usize = 64 * 1024;

/// Start `spec` with a parent-death signal (SIGKILL when the spawning thread ends), in a process
/// group of its own, with every signal unblocked and every handled signal back at its default.
pub fn spawn(spec: &Spec) -> io::Result<Spawned> {
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput));
    let program = cstr(spec.program.as_os_str().as_bytes())?;
    let root = spec
        .root
        .map(|r| cstr(r.as_os_str().as_bytes()))
        .transpose()?;
    // The environment: plexus' own, with `spec.env` set over it.
    let mut vars: Vec<(Vec<u8>, Vec<u8>)> = std::env::vars_os()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    for (k, v) in spec.env {
        vars.retain(|(key, _)| key.as_slice() != k.as_bytes());
        vars.push((k.as_bytes().to_vec(), v.as_bytes().to_vec()));
    }
    let env: Vec<CString> = vars
        .into_iter()
        .map(|(mut k, v)| {
            k.push(b'=');
            k.extend_from_slice(&v);
            cstr(&k)
        })
        .collect::<io::Result<_>>()?;
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|c| c.as_ptr()).collect();
    envp.push(std::ptr::null());

    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let mut args = ChildArgs {
        argv: [program.as_ptr(), std::ptr::null()],
        program,
        envp,
        root,
        fds: [
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ],
        parent: std::process::id() as libc::pid_t,
        failed: AtomicI32::new(0),
    };
    let mut stack = vec![0u8; CHILD_STACK];
    // The stack grows down: its top, 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;

    // Every signal blocked across the clone: a handler of plexus' must never run in the child,
    // which shares plexus' memory until its exec.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain libc calls on local, initialised sigsets; the clone's child only reads
    // `args` (alive until the clone returns: CLONE_VFORK suspends this thread until the child
    // has exec'd or exited) and runs on `stack`, which outlives it the same way.
    let pid = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &mut args as *mut ChildArgs as *mut libc::c_void,
        );
        let clone_err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_err);
        }
        pid
    };
    drop(stack);
    let failed = args.failed.load(Ordering::SeqCst);
    if failed != 0 {
        // It exited without exec'ing: reap it.
        let _ = wait(pid);
        return Err(io::Error::from_raw_os_error(failed));
    }
    drop((stdin_r, stdout_w, stderr_w));
    Ok(Spawned {
        pid,
        stdin: File::from(stdin_w),
        stdout: File::from(stdout_r),
        stderr: File::from(stderr_r),
    })
}

/// Wait for child `pid` to exit (retrying on EINTR) and reap it.
pub fn wait(pid: i32) -> io::Result<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)
}

/// The clone's child: from here to `execve` only async-signal-safe calls.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive while the parent is suspended (vfork).
    let a = unsafe { &*(arg as *const ChildArgs) };
    let fail = || -> ! {
        a.failed.store(
            std::io::Error::last_os_error()
                .raw_os_error()
                .filter(|e| *e != 0)
                .unwrap_or(libc::ECHILD),
            Ordering::SeqCst,
        );
        // SAFETY: leave without running anything of the parent's (atexit handlers, buffers).
        unsafe { libc::_exit(127) }
    };
    // SAFETY: libc calls with valid pointers prepared by the parent.
    unsafe {
        // Handlers point into plexus' code: back to the defaults before any signal can arrive.
        // Ignored signals stay ignored across the exec, as with a fork, except SIGPIPE, which
        // Rust ignores in plexus and a plugin expects at its default (std's Command does the same).
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut cur: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0 {
                continue;
            }
            if sig == libc::SIGPIPE
                || (cur.sa_sigaction != libc::SIG_IGN && cur.sa_sigaction != libc::SIG_DFL)
            {
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if libc::setpgid(0, 0) != 0 {
            fail();
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            fail();
        }
        // Plexus died before the prctl took effect: no signal will come.
        if libc::getppid() != a.parent {
            fail();
        }
        if let Some(root) = &a.root {
            if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                fail();
            }
        }
        for (target, fd) in a.fds.iter().enumerate() {
            let target = target as libc::c_int;
            if *fd == target {
                // Already in place: only its close-on-exec flag must go.
                if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                    fail();
                }
            } else if libc::dup2(*fd, target) < 0 {
                fail();
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(a.program.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr());
        fail()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn run(spec: &Spec, input: &[u8]) -> (ExitStatus, String, String) {
        let mut s = spawn(spec).expect("spawn");
        s.stdin.write_all(input).unwrap();
        drop(s.stdin);
        let (mut out, mut err) = (String::new(), String::new());
        s.stdout.read_to_string(&mut out).unwrap();
        s.stderr.read_to_string(&mut err).unwrap();
        (wait(s.pid).unwrap(), out, err)
    }

    fn sh(script: &str) -> (ExitStatus, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let env: [(&str, &OsStr); 2] = [
            ("PLEXUS_SPAWN_TEST", OsStr::new("first")),
            ("PLEXUS_SPAWN_TEST", OsStr::new("set")),
        ];
        run(
            &Spec {
                program: &p,
                env: &env,
                root: None,
            },
            b"from stdin",
        )
    }

    #[test]
    fn passes_stdin_env_and_exit_status_and_splits_the_streams() {
        let (status, out, err) =
            sh("read line; echo \"$line/$PLEXUS_SPAWN_TEST/${HOME:+home}\"; echo oops >&2; exit 3");
        assert_eq!(status.code(), Some(3));
        // The later entry wins; plexus' own environment (HOME) is inherited.
        assert_eq!(out, "from stdin/set/home\n");
        assert_eq!(err, "oops\n");
    }

    #[test]
    fn leads_its_own_process_group_with_no_signal_blocked_and_sigpipe_at_its_default() {
        let (status, out, _) = sh(
            // Shell builtins only: a command the shell forked would race its reading of
            // /proc/$$ against the shell's own signal blocking around that fork.
            "echo $$; read -r st < /proc/$$/stat; set -- $st; echo $5; while read -r k v; do case $k in SigBlk:|SigIgn:) echo \"$k $v\";; esac; done < /proc/$$/status",
        );
        assert!(status.success());
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines[0], lines[1], "pid and process group: {out}");
        let mask = |name: &str| {
            let l = lines.iter().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(l.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(mask("SigBlk:"), 0, "{out}");
        // SIGPIPE (13) is ignored in the test binary (Rust's runtime) but not in the child.
        assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
    }

    #[test]
    fn a_program_that_cannot_start_is_its_errno() {
        let env: [(&str, &OsStr); 0] = [];
        let missing = Spec {
            program: Path::new("/nonexistent/plugin"),
            env: &env,
            root: None,
        };
        let e = spawn(&missing).err().expect("no such program");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("not-executable");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        let e = spawn(&Spec {
            program: &p,
            env: &env,
            root: None,
        })
        .err()
        .expect("not executable");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    }

    #[test]
    fn a_nul_in_the_environment_is_refused_before_anything_starts() {
        let env: [(&str, &OsStr); 1] = [("X", OsStr::from_bytes(b"a\0b"))];
        let e = spawn(&Spec {
            program: Path::new("/bin/true"),
            env: &env,
            root: None,
        })
        .err()
        .unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }
}
