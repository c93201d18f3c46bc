//! The host binaries as shipped (`scripts/release-build.sh`, its output directory in
//! `PLEXUS_RELEASE_DIR`) run on glibc 2.28 (RHEL 8): for each of `plexus`, `plexus-daemon`,
//! `sriov` and `plexus-shim`, the file is an x86-64 ELF, the highest `GLIBC_` symbol version it
//! needs is at most 2.28, it needs no library RHEL 8 lacks, and it runs. A static binary must
//! not carry glibc's NSS (which would load the build host's modules at run time); the thin
//! plugin, dynamic, resolves the API server's host name through the host's own glibc.
//!
//! Without `PLEXUS_RELEASE_DIR` the binary checks are skipped with a message, unless
//! `PLEXUS_RELEASE_REQUIRE=1` (then they fail). The ELF reader and the version parser are
//! checked either way.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The oldest glibc the host binaries must run on (RHEL 8).
const GLIBC_FLOOR: &[u32] = &[2, 28];

/// What the installer puts on a host, and whether it is linked statically.
const SHIPPED: &[(&str, Linking)] = &[
    ("plexus", Linking::Dynamic),
    ("plexus-daemon", Linking::Dynamic),
    ("sriov", Linking::Dynamic),
    ("plexus-shim", Linking::Static),
];

/// The libraries a dynamic binary may need: all in RHEL 8's glibc and libgcc packages.
const ALLOWED_NEEDED: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Linking {
    Dynamic,
    Static,
}

/// The release directory, or `None` (with the reason printed) when the checks do not run.
fn release_dir() -> Option<PathBuf> {
    match std::env::var_os("PLEXUS_RELEASE_DIR").filter(|v| !v.is_empty()) {
        Some(d) => Some(PathBuf::from(d)),
        None if std::env::var("PLEXUS_RELEASE_REQUIRE").as_deref() == Ok("1") => {
            panic!("PLEXUS_RELEASE_REQUIRE=1 but PLEXUS_RELEASE_DIR is not set (run scripts/release-build.sh)")
        }
        None => {
            eprintln!(
                "release_binaries: skipped: PLEXUS_RELEASE_DIR is not set (the output directory of scripts/release-build.sh)"
            );
            None
        }
    }
}

/// The glibc release a symbol version name from a binary's version needs: `Ok(None)` for a
/// name that is not glibc's (`GCC_3.0` of libgcc_s), an error for one no release provides to
/// programs (`GLIBC_PRIVATE`) or that this parser does not know.
fn glibc_release(name: &str) -> Result<Option<Vec<u32>>, String> {
    let Some(rest) = name.strip_prefix("GLIBC_") else {
        return Ok(None);
    };
    // Packed relative relocations (DT_RELR), which a linker may emit: glibc 2.36 and later.
    if rest == "ABI_DT_RELR" {
        return Ok(Some(vec![2, 36]));
    }
    let parts: Result<Vec<u32>, _> = rest.split('.').map(str::parse::<u32>).collect();
    match parts {
        Ok(p) if p.len() >= 2 => Ok(Some(p)),
        _ => Err(format!("unknown glibc symbol version {name}")),
    }
}

/// The highest glibc release `names` need (compared as numbers: 2.28 > 2.3.4 > 2.2.5), `None`
/// when they need none.
fn highest_glibc<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Option<Vec<u32>>, String> {
    let mut max: Option<Vec<u32>> = None;
    for n in names {
        if let Some(v) = glibc_release(n)? {
            if max.as_ref().is_none_or(|m| v > *m) {
                max = Some(v);
            }
        }
    }
    Ok(max)
}

fn dotted(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
}

/// What the checks need from an ELF file, read from its program and section headers.
#[derive(Debug)]
struct Elf {
    /// `e_machine` (62: x86-64).
    machine: u16,
    /// The program interpreter (`PT_INTERP`), for a dynamically linked program.
    interp: Option<String>,
    /// `DT_NEEDED` entries.
    needed: Vec<String>,
    /// Version names needed from shared libraries (`SHT_GNU_verneed`), e.g. `GLIBC_2.28`.
    version_needs: Vec<String>,
}

const EM_X86_64: u16 = 62;
const PT_INTERP: u32 = 3;
const SHT_DYNAMIC: u32 = 6;
const SHT_GNU_VERNEED: u32 = 0x6fff_fffe;
const DT_NEEDED: u64 = 1;

fn field(b: &[u8], off: usize, len: usize) -> Result<&[u8], String> {
    off.checked_add(len)
        .and_then(|end| b.get(off..end))
        .ok_or_else(|| format!("ELF truncated at offset {off}"))
}
fn u16_at(b: &[u8], off: usize) -> Result<u16, String> {
    Ok(u16::from_le_bytes(field(b, off, 2)?.try_into().unwrap()))
}
fn u32_at(b: &[u8], off: usize) -> Result<u32, String> {
    Ok(u32::from_le_bytes(field(b, off, 4)?.try_into().unwrap()))
}
fn u64_at(b: &[u8], off: usize) -> Result<usize, String> {
    let v = u64::from_le_bytes(field(b, off, 8)?.try_into().unwrap());
    usize::try_from(v).map_err(|_| format!("ELF offset {v} too large"))
}
fn cstr_at(b: &[u8], off: usize) -> Result<String, String> {
    let tail = b
        .get(off..)
        .ok_or_else(|| format!("string at {off} outside the file"))?;
    let end = tail
        .iter()
        .position(|&c| c == 0)
        .ok_or_else(|| format!("string at {off} not terminated"))?;
    Ok(String::from_utf8_lossy(&tail[..end]).into_owned())
}

/// A section header's offset, size, link and info.
struct Section {
    kind: u32,
    offset: usize,
    size: usize,
    link: usize,
    info: usize,
}

impl Elf {
    /// Reads a 64-bit little-endian ELF file.
    fn parse(b: &[u8]) -> Result<Elf, String> {
        if field(b, 0, 4)? != b"\x7fELF" {
            return Err("not an ELF file".into());
        }
        let ident = field(b, 4, 2)?;
        if ident != [2, 1] {
            return Err(format!("not 64-bit little-endian (class, data: {ident:?})"));
        }
        let machine = u16_at(b, 0x12)?;
        let (phoff, shoff) = (u64_at(b, 0x20)?, u64_at(b, 0x28)?);
        let (phentsize, phnum) = (u16_at(b, 0x36)? as usize, u16_at(b, 0x38)? as usize);
        let (shentsize, shnum) = (u16_at(b, 0x3a)? as usize, u16_at(b, 0x3c)? as usize);
        let mut interp = None;
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            if u32_at(b, ph)? == PT_INTERP {
                let (off, size) = (u64_at(b, ph + 8)?, u64_at(b, ph + 0x20)?);
                interp = Some(cstr_at(field(b, off, size)?, 0)?);
            }
        }
        let sections = (0..shnum)
            .map(|i| {
                let sh = shoff + i * shentsize;
                Ok(Section {
                    kind: u32_at(b, sh + 4)?,
                    offset: u64_at(b, sh + 0x18)?,
                    size: u64_at(b, sh + 0x20)?,
                    link: u32_at(b, sh + 0x28)? as usize,
                    info: u32_at(b, sh + 0x2c)? as usize,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        if sections.is_empty() && interp.is_some() {
            return Err("a dynamic ELF without section headers".into());
        }
        let strings = |s: &Section| -> Result<&[u8], String> {
            let t = sections
                .get(s.link)
                .ok_or_else(|| format!("string table {} missing", s.link))?;
            field(b, t.offset, t.size)
        };
        let (mut needed, mut version_needs) = (Vec::new(), Vec::new());
        for s in &sections {
            match s.kind {
                SHT_DYNAMIC => {
                    let strtab = strings(s)?;
                    for e in (s.offset..s.offset + s.size).step_by(16) {
                        if u64_at(b, e)? as u64 == DT_NEEDED {
                            needed.push(cstr_at(strtab, u64_at(b, e + 8)?)?);
                        }
                    }
                }
                SHT_GNU_VERNEED => {
                    let strtab = strings(s)?;
                    let mut vn = s.offset;
                    for _ in 0..s.info {
                        let (cnt, aux, next) = (
                            u16_at(b, vn + 2)?,
                            u32_at(b, vn + 8)? as usize,
                            u32_at(b, vn + 12)? as usize,
                        );
                        let mut va = vn + aux;
                        for _ in 0..cnt {
                            version_needs.push(cstr_at(strtab, u32_at(b, va + 8)? as usize)?);
                            va += u32_at(b, va + 12)? as usize;
                        }
                        vn += next;
                    }
                }
                _ => {}
            }
        }
        Ok(Elf {
            machine,
            interp,
            needed,
            version_needs,
        })
    }
}

/// Runs `bin` with `args`, `env` and `stdin`; its stdout, or why it failed (non-zero exit, or
/// no exit within 20 s).
fn run(bin: &Path, args: &[&str], env: &[(&str, &str)], stdin: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let stdin_file = dir.path().join("stdin");
    std::fs::write(&stdin_file, stdin).unwrap();
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir.path())
        .stdin(std::fs::File::open(&stdin_file).unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{} cannot be started: {e}", bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            return Err(format!(
                "{} {args:?} did not exit within 20 s",
                bin.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{} {args:?}: {}; stdout {stdout:?}; stderr {:?}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout)
}

/// Runs the shipped binary `name` the way it is cheapest to start, checking what it prints: a
/// release build's version line names its commit (scripts/release-build.sh records it).
fn check_runs(name: &str, bin: &Path) -> Result<(), String> {
    let version = |out: String, program: &str| {
        let prefix = format!("{program} {} (commit ", env!("CARGO_PKG_VERSION"));
        if out.starts_with(&prefix) {
            Ok(())
        } else {
            Err(format!("{name}: expected {prefix:?}…, got {out:?}"))
        }
    };
    let cni_version = || -> Result<(), String> {
        let out = run(
            bin,
            &[],
            &[("CNI_COMMAND", "VERSION")],
            r#"{"cniVersion":"1.0.0"}"#,
        )?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| format!("{name}: CNI VERSION printed {out:?}: {e}"))?;
        match v["supportedVersions"].as_array() {
            Some(a) if a.iter().any(|x| x == "1.0.0") => Ok(()),
            _ => Err(format!("{name}: CNI VERSION printed {out:?}")),
        }
    };
    match name {
        "plexus" => {
            version(run(bin, &["version"], &[], "")?, "plexus")?;
            cni_version()
        }
        "sriov" => {
            version(run(bin, &["version"], &[], "")?, "sriov")?;
            cni_version()
        }
        "plexus-daemon" => version(run(bin, &["--version"], &[], "")?, "plexus-daemon"),
        "plexus-shim" => cni_version(),
        _ => Err(format!("no run check for {name}")),
    }
}

/// Everything wrong with one shipped binary (empty when it passes).
fn check_binary(dir: &Path, name: &str, linking: Linking) -> Vec<String> {
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => return vec![format!("{}: {e}", path.display())],
    };
    let elf = match Elf::parse(&bytes) {
        Ok(e) => e,
        Err(e) => return vec![format!("{name}: {e}")],
    };
    let mut bad = Vec::new();
    if elf.machine != EM_X86_64 {
        bad.push(format!("{name}: e_machine {} is not x86-64", elf.machine));
    }
    match highest_glibc(elf.version_needs.iter().map(String::as_str)) {
        Ok(Some(v)) if v.as_slice() > GLIBC_FLOOR => bad.push(format!(
            "{name}: needs glibc {} (> {}): {:?}",
            dotted(&v),
            dotted(GLIBC_FLOOR),
            elf.version_needs
        )),
        Ok(_) => {}
        Err(e) => bad.push(format!("{name}: {e}")),
    }
    for lib in &elf.needed {
        if !ALLOWED_NEEDED.contains(&lib.as_str()) {
            bad.push(format!(
                "{name}: needs {lib}, which a RHEL 8 host may not have"
            ));
        }
    }
    match linking {
        Linking::Dynamic => {
            if elf.interp.as_deref() != Some("/lib64/ld-linux-x86-64.so.2") {
                bad.push(format!(
                    "{name}: interpreter {:?}, expected the x86-64 glibc loader",
                    elf.interp
                ));
            }
            if !elf.needed.iter().any(|l| l == "libc.so.6") {
                bad.push(format!(
                    "{name}: dynamic but not linked against libc.so.6: {:?}",
                    elf.needed
                ));
            }
        }
        Linking::Static => {
            if elf.interp.is_some() || !elf.needed.is_empty() {
                bad.push(format!(
                    "{name}: expected static, has interpreter {:?} and needs {:?}",
                    elf.interp, elf.needed
                ));
            }
            // glibc's NSS (getaddrinfo, getpwnam) in a static binary dlopens the build host's
            // libnss_* modules at run time: a static binary must not resolve names.
            if bytes.windows(7).any(|w| w == b"libnss_") {
                bad.push(format!(
                    "{name}: static with glibc's NSS (name resolution) linked in"
                ));
            }
        }
    }
    if let Err(e) = check_runs(name, &path) {
        bad.push(e);
    }
    bad
}

#[test]
fn shipped_binaries_need_at_most_glibc_2_28_are_x86_64_and_run() {
    let Some(dir) = release_dir() else { return };
    let bad: Vec<String> = SHIPPED
        .iter()
        .flat_map(|(name, linking)| check_binary(&dir, name, *linking))
        .collect();
    assert!(
        bad.is_empty(),
        "{} problem(s):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

/// The thin plugin, as shipped, resolves the API server's host name (`localhost` here, from
/// the host's /etc/hosts through its own glibc's NSS) and connects: an ADD for a pod reads the
/// pod first, from a kubeconfig whose server is `https://localhost:<port>` of a listener this
/// test owns. The netns does not exist, so nothing is set up on the host; the state goes to a
/// temporary directory.
#[test]
fn shipped_plexus_resolves_the_api_server_host_name() {
    let Some(dir) = release_dir() else { return };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut conn, peer)) = listener.accept() {
            // Read the TLS client hello's first byte (0x16: handshake) before closing.
            let mut first = [0u8; 1];
            conn.set_read_timeout(Some(Duration::from_secs(5))).ok();
            let n = conn.read(&mut first).unwrap_or(0);
            tx.send((peer, n, first[0])).ok();
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://localhost:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let p = |s: &str| tmp.path().join(s).display().to_string();
    let conf = serde_json::json!({
        "cniVersion": "1.0.0", "name": "plexus-net", "type": "plexus",
        "kubeconfig": kubeconfig, "cniDir": p("state"), "binDir": p("bin"), "confDir": p("confdir"),
        "logFile": p("plexus.log"), "logToStderr": false,
        "delegates": [{"cniVersion": "1.0.0", "name": "cluster", "type": "loopback"}]
    });
    let netns = p("no-such-netns");
    let env = [
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "cid-resolve"),
        ("CNI_NETNS", netns.as_str()),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/nonexistent"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=resolve;K8S_POD_INFRA_CONTAINER_ID=cid-resolve;K8S_POD_UID=u1",
        ),
    ];
    let result = run(&dir.join("plexus"), &[], &env, &conf.to_string());
    let accepted = rx.recv_timeout(Duration::from_secs(10));
    let Ok((peer, n, first)) = accepted else {
        panic!("plexus never connected to localhost:{port}; its answer: {result:?}");
    };
    assert!(peer.ip().is_loopback(), "{peer}");
    assert_eq!(
        (n, first),
        (1, 0x16),
        "the first byte plexus sent is a TLS handshake"
    );
    // The ADD itself fails (the listener is no API server), as a CNI error naming the pod.
    let Err(e) = result else {
        panic!("the ADD succeeded against a listener that is no API server: {result:?}")
    };
    assert!(e.contains("default/resolve"), "{e}");
}

#[test]
fn glibc_versions_compare_as_numbers() {
    assert_eq!(glibc_release("GLIBC_2.28"), Ok(Some(vec![2, 28])));
    assert_eq!(glibc_release("GLIBC_2.2.5"), Ok(Some(vec![2, 2, 5])));
    assert_eq!(glibc_release("GCC_3.0"), Ok(None));
    assert_eq!(glibc_release("GLIBC_ABI_DT_RELR"), Ok(Some(vec![2, 36])));
    assert!(glibc_release("GLIBC_PRIVATE").is_err());
    assert!(glibc_release("GLIBC_2").is_err());
    assert!(glibc_release("GLIBC_2.x").is_err());
    // As text, "GLIBC_2.3.4" sorts after "GLIBC_2.28"; as versions it is older.
    let names = ["GLIBC_2.3.4", "GLIBC_2.28", "GLIBC_2.2.5", "GCC_4.2.0"];
    assert_eq!(highest_glibc(names), Ok(Some(vec![2, 28])));
    assert!(
        highest_glibc(["GLIBC_2.2.5", "GLIBC_2.34"])
            .unwrap()
            .unwrap()
            .as_slice()
            > GLIBC_FLOOR
    );
    assert!(
        highest_glibc(["GLIBC_2.17", "GLIBC_ABI_DT_RELR"])
            .unwrap()
            .unwrap()
            .as_slice()
            > GLIBC_FLOOR
    );
    assert_eq!(highest_glibc(["GCC_3.0"]), Ok(None));
    assert_eq!(dotted(&[2, 2, 5]), "2.2.5");
}

/// The reader on a file that is always there: this test's own executable (x86-64, dynamic,
/// linked by the build host against its glibc), and on files that are no ELF.
#[test]
fn the_elf_reader_reads_this_test_binary() {
    let bytes = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let elf = Elf::parse(&bytes).unwrap();
    assert_eq!(elf.machine, EM_X86_64);
    assert!(
        elf.interp
            .as_deref()
            .is_some_and(|i| i.contains("ld-linux")),
        "{elf:?}"
    );
    assert!(elf.needed.iter().any(|l| l == "libc.so.6"), "{elf:?}");
    assert!(
        elf.version_needs.iter().any(|v| v == "GLIBC_2.2.5"),
        "{elf:?}"
    );
    assert!(highest_glibc(elf.version_needs.iter().map(String::as_str))
        .unwrap()
        .is_some());
    assert!(Elf::parse(b"#!/bin/sh\n").is_err());
    assert!(Elf::parse(&bytes[..40]).is_err());
}
