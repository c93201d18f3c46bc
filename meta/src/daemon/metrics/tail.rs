//! Thin mode's exporter: reads the lines thin calls append to `<dir>/outcomes.jsonl`
//! ([`crate::outcome`]) into a [`Metrics`] registry, which `plexus-daemon reconcile
//! --metrics-address` serves.
//!
//! - It remembers its offset and reads only complete lines (a line being written is read at
//!   the next poll).
//! - A file shorter than the offset was truncated: it reads it again from the start.
//! - Past [`ROTATE_BYTES`] read, it renames the file to `outcomes.jsonl.1` (the next call
//!   creates a new one); the renamed file is read once more at the next poll, for a call that
//!   opened it just before the rename. A file replaced by someone else is handled alike.
//! - At start it reads the current file from its beginning (at most [`ROTATE_BYTES`] and what
//!   calls added since): counters restart with the process, as Prometheus expects.

use super::Metrics;
use crate::outcome;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The exporter rotates the file once it has read this much of it.
pub const ROTATE_BYTES: u64 = outcome::MAX_FILE_BYTES / 4;

/// Bytes read per poll at most (the rest at the next one).
const READ_CHUNK: u64 = 8 << 20;

struct Open {
    file: File,
    ino: u64,
    offset: u64,
}

/// The reader of one metrics directory.
pub struct Tail {
    path: PathBuf,
    current: Option<Open>,
    /// A rotated file, read to its end once more at the next poll.
    rotated: Option<Open>,
    /// Lines that are no outcome (counted, logged once).
    pub skipped: u64,
}

impl Tail {
    /// Read `dir/outcomes.jsonl`.
    pub fn new(dir: &Path) -> Tail {
        Tail {
            path: dir.join(outcome::FILE_NAME),
            current: None,
            rotated: None,
            skipped: 0,
        }
    }

    /// Read what is new into `m`; returns the outcomes applied.
    pub fn poll(&mut self, m: &Metrics) -> usize {
        let mut n = 0;
        if let Some(mut old) = self.rotated.take() {
            n += self.read(&mut old, m);
        }
        let on_disk = std::fs::metadata(&self.path).ok().map(|md| md.ino());
        let replaced = match (&self.current, on_disk) {
            (Some(c), Some(ino)) => c.ino != ino,
            (Some(_), None) => true,
            _ => false,
        };
        if replaced {
            // Someone else rotated or removed it: finish it now and once more next time.
            if let Some(mut c) = self.current.take() {
                n += self.read(&mut c, m);
                self.rotated = Some(c);
            }
        }
        if self.current.is_none() {
            if let Ok(file) = File::open(&self.path) {
                if let Ok(md) = file.metadata() {
                    self.current = Some(Open {
                        file,
                        ino: md.ino(),
                        offset: 0,
                    });
                }
            }
        }
        if let Some(mut c) = self.current.take() {
            n += self.read(&mut c, m);
            if c.offset >= ROTATE_BYTES {
                let to = self.path.with_extension("jsonl.1");
                match std::fs::rename(&self.path, &to) {
                    Ok(()) => self.rotated = Some(c),
                    Err(e) => {
                        tracing::warn!(file = %self.path.display(), error = %e, "cannot rotate the call outcomes");
                        self.current = Some(c);
                    }
                }
            } else {
                self.current = Some(c);
            }
        }
        n
    }

    /// Apply the complete lines of `o` after its offset.
    fn read(&mut self, o: &mut Open, m: &Metrics) -> usize {
        let Ok(len) = o.file.metadata().map(|md| md.len()) else {
            return 0;
        };
        if len < o.offset {
            tracing::info!(file = %self.path.display(), "call outcomes truncated: reading from the start");
            o.offset = 0;
        }
        if len == o.offset || o.file.seek(SeekFrom::Start(o.offset)).is_err() {
            return 0;
        }
        let mut buf = Vec::new();
        if (&o.file).take(READ_CHUNK).read_to_end(&mut buf).is_err() {
            return 0;
        }
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return 0;
        };
        let mut n = 0;
        for line in buf[..end].split(|b| *b == b'\n') {
            if line.is_empty() {
                continue;
            }
            match outcome::parse(line) {
                Some(out) => {
                    m.apply(&out);
                    n += 1;
                }
                None => {
                    if self.skipped == 0 {
                        tracing::warn!(file = %self.path.display(), "a line that is no call outcome skipped");
                    }
                    self.skipped += 1;
                }
            }
        }
        o.offset += end as u64 + 1;
        n
    }
}

/// What the exporter's endpoint serves.
pub struct ThinSource {
    /// The registry the lines are read into.
    pub metrics: std::sync::Arc<Metrics>,
}

impl super::super::metrics_http::MetricsSource for ThinSource {
    fn render(&self) -> String {
        self.metrics.encode()
    }

    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{Outcome, FORMAT};
    use std::io::Write;

    fn line(verb: &str, code: u32) -> Vec<u8> {
        let o = Outcome {
            format: FORMAT,
            verb: verb.into(),
            result: if code == 0 { "ok" } else { "error" }.into(),
            code,
            seconds: 0.01,
            phases: vec![("config".into(), 0.001)],
            delegates: vec![("ADD".into(), "bridge".into(), 0.004, code == 0)],
            api: vec![("get".into(), "pods".into(), "200".into(), 2)],
            claim_conflicts: u32::from(code == 11),
            ..Default::default()
        };
        let mut l = serde_json::to_vec(&o).unwrap();
        l.push(b'\n');
        l
    }

    fn append(path: &Path, bytes: &[u8]) {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
    }

    fn count(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    #[test]
    fn reads_complete_lines_once_and_handles_truncation() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join(outcome::FILE_NAME);
        let m = Metrics::for_mode("thin");
        let mut tail = Tail::new(t.path());
        assert_eq!(tail.poll(&m), 0, "no file yet");
        append(&path, &line("ADD", 0));
        append(&path, &line("ADD", 11));
        // Half a line: read at the next poll, once complete.
        let third = line("DEL", 0);
        append(&path, &third[..10]);
        assert_eq!(tail.poll(&m), 2);
        assert_eq!(tail.poll(&m), 0);
        append(&path, &third[10..]);
        assert_eq!(tail.poll(&m), 1);
        let text = m.encode();
        let ok = r#"plexus_cni_requests_total{verb="ADD",result="ok",code="0"}"#;
        let busy = r#"plexus_cni_requests_total{verb="ADD",result="error",code="11"}"#;
        assert_eq!(count(&text, ok), 1.0, "{text}");
        assert_eq!(count(&text, busy), 1.0, "{text}");
        assert_eq!(count(&text, "plexus_address_claim_conflicts_total"), 1.0);
        assert_eq!(
            count(
                &text,
                r#"plexus_api_requests_total{verb="get",resource="pods",code="200"}"#
            ),
            6.0
        );
        assert_eq!(
            count(
                &text,
                r#"plexus_delegate_errors_total{verb="ADD",type="bridge"}"#
            ),
            1.0
        );
        assert!(
            text.contains(r#"plexus_build_info{version=""#) && text.contains(r#"mode="thin"} 1"#),
            "{text}"
        );
        // Truncated: read again from the start.
        std::fs::write(&path, line("DEL", 0)).unwrap();
        assert_eq!(tail.poll(&m), 1);
        let text = m.encode();
        let del = r#"plexus_cni_requests_total{verb="DEL",result="ok",code="0"}"#;
        assert_eq!(count(&text, del), 2.0, "{text}");
        // A junk line is skipped, not counted.
        append(&path, b"not json\n");
        assert_eq!(tail.poll(&m), 0);
        assert_eq!(tail.skipped, 1);
    }

    #[test]
    fn rotates_past_the_bound_and_still_reads_late_writers_of_the_old_file() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join(outcome::FILE_NAME);
        let m = Metrics::for_mode("thin");
        let mut tail = Tail::new(t.path());
        let l = line("ADD", 0);
        let n = (ROTATE_BYTES as usize / l.len()) + 1;
        append(&path, &l.repeat(n));
        // A writer that opened the file before the rotation.
        let mut late = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        assert_eq!(tail.poll(&m), n);
        assert!(!path.exists(), "rotated");
        assert!(path.with_extension("jsonl.1").exists());
        late.write_all(&l).unwrap();
        append(&path, &line("DEL", 0));
        assert_eq!(tail.poll(&m), 2, "the late line and the new file's");
        let text = m.encode();
        let add = r#"plexus_cni_requests_total{verb="ADD",result="ok",code="0"}"#;
        assert_eq!(count(&text, add), (n + 1) as f64);
        assert_eq!(tail.poll(&m), 0);
    }
}
