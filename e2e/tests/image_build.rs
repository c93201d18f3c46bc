//! The installer image as `scripts/build-image.sh` builds it (what the node tiers run, through
//! `realk8s::image::plexus_image`), checked against `deploy/Dockerfile` (Docker cannot run here,
//! so their declared file sets are compared): the same files in the final image and the same
//! entrypoint; the archive a valid OCI image layout (every blob named by its sha256, sizes and
//! layer diff IDs as the manifest and config say, readable by skopeo); the Debian layer holding
//! every program deploy/install.sh runs, which runs there, as do the binaries; two builds, one
//! from the cache and one without, byte for byte the same. Needs root (mmdebstrap extracts with
//! owners) and Debian's package mirror; the binaries are the debug e2e builds.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use plexus_e2e::realk8s::image::{self, IMAGE_BINARIES};
use serde_json::Value;

fn repo(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

/// The programs deploy/install.sh runs (every command word of the script that is not a shell
/// builtin or one of its functions), and the readiness probes' `sh`.
const INSTALLER_PROGRAMS: &[&str] = &[
    "sh",
    "jq",
    "cp",
    "mv",
    "cmp",
    "dd",
    "sha256sum",
    "cut",
    "base64",
    "tr",
    "mkdir",
    "rm",
    "grep",
    "sleep",
    "cat",
    "date",
    "chmod",
    "find",
    "head",
    "sort",
    "wc",
    "timeout",
    "stat",
];

/// One build, shared by the checks: the archive, unpacked (removed on drop).
struct Built {
    _dir: tempfile::TempDir,
    archive: PathBuf,
    sbom: String,
    /// The unpacked layout.
    layout: PathBuf,
    /// The image's root, both layers applied.
    root: PathBuf,
}

fn build() -> Built {
    {
        let dir = tempfile::tempdir().expect("tempdir");
        let bins: Vec<(&str, PathBuf)> = IMAGE_BINARIES
            .iter()
            .map(|n| (*n, common::bin(n)))
            .collect();
        let archive =
            image::plexus_image(&dir.path().join("work"), &repo("deploy/install.sh"), &bins)
                .expect("scripts/build-image.sh");
        let sbom = std::fs::read_to_string(dir.path().join("work/plexus-image.sbom.txt"))
            .expect("the SBOM beside the archive");
        let layout = dir.path().join("layout");
        std::fs::create_dir(&layout).unwrap();
        run("tar", &["-xf", s(&archive), "-C", s(&layout)]);
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        for layer in manifest(&layout)["layers"].as_array().unwrap() {
            run(
                "tar",
                &["-xzf", s(&blob(&layout, &layer["digest"])), "-C", s(&root)],
            );
        }
        Built {
            _dir: dir,
            archive,
            sbom,
            layout,
            root,
        }
    }
}

/// One build (a static would never be dropped and would leave its files in /tmp), then each
/// check in turn.
#[test]
fn installer_image_built_by_the_script() {
    let b = build();
    dockerfile_and_script_put_the_same_files_in_the_image(&b);
    archive_is_an_oci_layout_whose_digests_match(&b);
    installer_and_binaries_run_in_the_image_root(&b);
    builds_with_and_without_the_cache_are_the_same_bytes(&b);
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_file(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn blob(layout: &Path, digest: &Value) -> PathBuf {
    let d = digest.as_str().unwrap();
    layout
        .join("blobs/sha256")
        .join(d.strip_prefix("sha256:").unwrap())
}

fn index(layout: &Path) -> Value {
    json_file(&layout.join("index.json"))
}

fn manifest(layout: &Path) -> Value {
    json_file(&blob(layout, &index(layout)["manifests"][0]["digest"]))
}

fn sha256_hex(data: &[u8]) -> String {
    image::digest(data)["sha256:".len()..].to_string()
}

/// The Dockerfile's final stage: the files its COPY lines put in the image (destination paths),
/// its ENTRYPOINT, and the packages its `apt-get install` adds.
struct FinalStage {
    files: BTreeSet<String>,
    entrypoint: Vec<String>,
    packages: BTreeSet<String>,
}

fn dockerfile_final_stage() -> FinalStage {
    let text = std::fs::read_to_string(repo("deploy/Dockerfile")).unwrap();
    // Instructions with their continuation lines joined, comments dropped.
    let mut instructions = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(part) => cur.push_str(part),
            None => {
                cur.push_str(t);
                instructions.push(std::mem::take(&mut cur));
            }
        }
    }
    let last_from = instructions
        .iter()
        .rposition(|i| i.starts_with("FROM "))
        .expect("a FROM");
    let mut stage = FinalStage {
        files: BTreeSet::new(),
        entrypoint: Vec::new(),
        packages: BTreeSet::new(),
    };
    for ins in &instructions[last_from + 1..] {
        let words: Vec<&str> = ins.split_whitespace().collect();
        match words[0] {
            "COPY" => {
                let args: Vec<&str> = words[1..]
                    .iter()
                    .copied()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let (dest, srcs) = args.split_last().expect("COPY src… dest");
                for src in srcs {
                    let base = src.rsplit('/').next().unwrap();
                    let path = if dest.ends_with('/') {
                        format!("{dest}{base}")
                    } else {
                        dest.to_string()
                    };
                    stage.files.insert(path);
                }
            }
            "ENTRYPOINT" => {
                stage.entrypoint = serde_json::from_str(ins["ENTRYPOINT".len()..].trim())
                    .expect("ENTRYPOINT in exec form");
            }
            "RUN" => {
                if let Some(at) = ins.find("apt-get install") {
                    let rest = &ins[at + "apt-get install".len()..];
                    let cmd = rest.split("&&").next().unwrap();
                    stage.packages.extend(
                        cmd.split_whitespace()
                            .filter(|w| !w.starts_with('-'))
                            .map(str::to_string),
                    );
                }
            }
            _ => {}
        }
    }
    stage
}

/// The regular files of a gzip'd layer: path (absolute) → (mode, uid/gid).
fn layer_files(layer: &Path) -> BTreeMap<String, (String, String)> {
    run("tar", &["--numeric-owner", "-tvzf", s(layer)])
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (format!("/{}", f[5]), (f[0].to_string(), f[1].to_string()))
        })
        .collect()
}

fn dockerfile_and_script_put_the_same_files_in_the_image(b: &Built) {
    let stage = dockerfile_final_stage();
    let layers = manifest(&b.layout)["layers"].as_array().unwrap().clone();
    assert_eq!(layers.len(), 2, "a Debian layer, then plexus'");
    let plexus = layer_files(&blob(&b.layout, &layers[1]["digest"]));
    let script: BTreeSet<String> = plexus.keys().cloned().collect();
    assert_eq!(
        script, stage.files,
        "the script's plexus layer vs the Dockerfile's COPY lines"
    );
    for (path, (mode, owner)) in &plexus {
        assert_eq!(mode, "-rwxr-xr-x", "{path}");
        assert_eq!(owner, "0/0", "{path}");
    }
    let config = json_file(&blob(&b.layout, &manifest(&b.layout)["config"]["digest"]));
    let entrypoint: Vec<String> =
        serde_json::from_value(config["config"]["Entrypoint"].clone()).unwrap();
    assert_eq!(entrypoint, stage.entrypoint);
    // The Dockerfile adds packages to debian:12-slim; the script's Debian layer has them too.
    let packages: BTreeSet<&str> = b
        .sbom
        .lines()
        .skip_while(|l| !l.starts_with("## Debian packages"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split('\t').next())
        .collect();
    for p in &stage.packages {
        assert!(
            packages.contains(p.as_str()),
            "{p} (Dockerfile) not in the image: {packages:?}"
        );
    }
    assert!(packages.contains("libc6") && packages.contains("dash"));
}

fn archive_is_an_oci_layout_whose_digests_match(b: &Built) {
    let l = &b.layout;
    let layout: Value = json_file(&l.join("oci-layout"));
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    // Every blob is named by the sha256 of its content.
    let mut blobs = BTreeSet::new();
    for e in std::fs::read_dir(l.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert_eq!(sha256_hex(&std::fs::read(e.path()).unwrap()), name);
        blobs.insert(format!("sha256:{name}"));
    }
    let idx = index(l);
    let m = &idx["manifests"].as_array().unwrap()[..];
    assert_eq!(m.len(), 1, "{idx}");
    let name = image::image_ref().unwrap();
    assert_eq!(
        m[0]["annotations"]["io.containerd.image.name"],
        name.as_str()
    );
    assert_eq!(
        m[0]["annotations"]["org.opencontainers.image.ref.name"],
        name.as_str()
    );
    // Each descriptor's size is its blob's, and each blob is referenced.
    let manifest = manifest(l);
    let mut referenced = BTreeSet::new();
    for d in std::iter::once(&m[0])
        .chain(std::iter::once(&manifest["config"]))
        .chain(manifest["layers"].as_array().unwrap())
    {
        let len = std::fs::metadata(blob(l, &d["digest"])).unwrap().len();
        assert_eq!(d["size"].as_u64(), Some(len), "{d}");
        referenced.insert(d["digest"].as_str().unwrap().to_string());
    }
    assert_eq!(referenced, blobs);
    // The config's diff IDs are the sha256 of the uncompressed layers.
    let config = json_file(&blob(l, &manifest["config"]["digest"]));
    let diff_ids: Vec<String> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|layer| {
            assert_eq!(
                layer["mediaType"],
                "application/vnd.oci.image.layer.v1.tar+gzip"
            );
            let out = Command::new("gzip")
                .arg("-dc")
                .arg(blob(l, &layer["digest"]))
                .output()
                .unwrap();
            assert!(out.status.success());
            format!("sha256:{}", sha256_hex(&out.stdout))
        })
        .collect();
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::to_value(&diff_ids).unwrap()
    );
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["os"], "linux");
    // skopeo (what puts images into CRI-O's storage) reads the archive as this image.
    let inspect: Value = serde_json::from_str(&run(
        "skopeo",
        &["inspect", &format!("oci-archive:{}", s(&b.archive))],
    ))
    .unwrap();
    assert_eq!(inspect["Digest"], m[0]["digest"], "{inspect}");
    assert_eq!(inspect["Layers"].as_array().unwrap().len(), 2);
}

fn installer_and_binaries_run_in_the_image_root(b: &Built) {
    let root = s(&b.root);
    for p in INSTALLER_PROGRAMS {
        let found = run(
            "chroot",
            &[root, "/bin/sh", "-c", &format!("command -v {p}")],
        );
        assert!(found.trim().starts_with('/'), "{p}: {found:?}");
    }
    // The installer parses its options and checks jq before doing anything.
    let help = run("chroot", &[root, "/install.sh", "--help"]);
    assert!(help.contains("--bin-dir"), "{help}");
    let jq = run(
        "chroot",
        &[
            root,
            "/bin/sh",
            "-c",
            r#"printf '{"a":[1,2]}' | jq -c '.a | add'"#,
        ],
    );
    assert_eq!(jq.trim(), "3");
    // The binaries find their loader and libraries in the image.
    for b in IMAGE_BINARIES {
        let path = format!("/usr/src/plexus/bin/{b}");
        let out = Command::new("chroot")
            .args([root, &path, "--version"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("error while loading shared libraries") && !err.contains("not found"),
            "{b} cannot start in the image: {err}"
        );
    }
    // /var/run leads to /run as in Debian (CNI_NETNS paths are /var/run/netns/…).
    let link = std::fs::read_link(b.root.join("var/run")).unwrap();
    assert_eq!(link, Path::new("/run"));
}

fn builds_with_and_without_the_cache_are_the_same_bytes(b: &Built) {
    let dir = tempfile::tempdir().unwrap();
    // From the cache (plexus_image's), then with a Debian layer bootstrapped afresh.
    let bins: Vec<(&str, PathBuf)> = IMAGE_BINARIES
        .iter()
        .map(|n| (*n, common::bin(n)))
        .collect();
    let again =
        image::plexus_image(&dir.path().join("again"), &repo("deploy/install.sh"), &bins).unwrap();
    let first = std::fs::read(&b.archive).unwrap();
    assert!(
        std::fs::read(&again).unwrap() == first,
        "a second build differs"
    );
    let fresh = dir.path().join("fresh.tar");
    let mut script = Command::new("bash");
    script.arg(repo("scripts/build-image.sh"));
    // The binaries plexus_image gave the script: the release ones as they are (CI), or its
    // stripped copies of the debug ones.
    match std::env::var_os("PLEXUS_RELEASE_DIR") {
        Some(release) => script.arg("--bin-dir").arg(release),
        None => script
            .args(["--bin-dir", s(&dir.path().join("again/bin"))])
            .arg("--strip"),
    };
    let out = script
        .args(["--install-sh", s(&repo("deploy/install.sh"))])
        .args(["--name", &image::image_ref().unwrap(), "--no-cache"])
        .args(["--out", s(&fresh)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let digest = printed.lines().last().unwrap();
    assert_eq!(digest, index(&b.layout)["manifests"][0]["digest"]);
    assert!(
        std::fs::read(&fresh).unwrap() == first,
        "a build without the cache differs"
    );
}
