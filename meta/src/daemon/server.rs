//! The daemon's CNI server: a Unix socket (mode 0600 in a directory of its own, 0700), an
//! accept thread, a bounded queue and a fixed pool of worker threads. Memory is bounded by
//! design: at most `maxConcurrent` calls run (each with its delegate processes) and at most
//! `queueSize` wait as accepted connections; a call beyond that is answered at once with code
//! 11 (try again later) and nothing is done for it. The bound is counted (calls accepted and
//! not finished), not left to the channel's capacity: a burst that arrives before the workers
//! are scheduled to take their first calls is not refused while a worker is free.

use super::metrics::Metrics;
use super::protocol::{read_message, write_message, Request, Response, MAX_REQUEST_BYTES};
use plexus_conf::error::{code, CniError};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Limits of the server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Calls served at once (worker threads).
    pub max_concurrent: usize,
    /// Accepted calls waiting for a worker.
    pub queue_size: usize,
}

/// Serves one decoded call; returns the plugin's output.
pub type Handler = dyn Fn(Request) -> Response + Send + Sync;

/// Create the socket's directory (0700, owned by the daemon) and bind the socket (0600),
/// replacing a stale one.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// The running server.
pub struct Server {
    path: PathBuf,
    metrics: Arc<Metrics>,
    workers: Vec<std::thread::JoinHandle<()>>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

struct Job {
    conn: UnixStream,
    accepted: Instant,
}

fn busy_response(limits: Limits) -> Response {
    let e = CniError::new(
        code::TRY_AGAIN_LATER,
        "the plexus daemon is busy",
        format!(
            "{} calls in progress and {} queued (maxConcurrent, queueSize); nothing was done for this call",
            limits.max_concurrent, limits.queue_size
        ),
    );
    Response {
        code: 1,
        stdout: e.with_version(plexus_conf::version::CURRENT).to_json(),
    }
}

impl Server {
    /// Start serving on `listener` (bound at `path`).
    pub fn start(
        listener: UnixListener,
        path: &Path,
        limits: Limits,
        metrics: Arc<Metrics>,
        handler: Arc<Handler>,
    ) -> Server {
        // Every event of the daemon's calls (API requests, delegates, claims, refusals) is
        // counted in this registry from now on.
        super::metrics::install_daemon(&metrics);
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let outstanding = Arc::new(AtomicUsize::new(0));
        let workers = (0..limits.max_concurrent.max(1))
            .map(|i| {
                let (rx, metrics, handler, outstanding) = (
                    Arc::clone(&rx),
                    Arc::clone(&metrics),
                    Arc::clone(&handler),
                    Arc::clone(&outstanding),
                );
                std::thread::Builder::new()
                    .name(format!("plexus-worker-{i}"))
                    .spawn(move || worker(&rx, &metrics, &*handler, &outstanding))
                    .expect("spawn worker thread")
            })
            .collect();
        let m = Arc::clone(&metrics);
        let acceptor = std::thread::Builder::new()
            .name("plexus-accept".into())
            .spawn(move || accept_loop(&listener, &tx, &m, limits, &outstanding))
            .expect("spawn accept thread");
        Server {
            path: path.to_path_buf(),
            metrics,
            workers,
            acceptor: Some(acceptor),
        }
    }

    /// Stop accepting (the socket disappears, so shims fall back at once), then wait up to
    /// `grace` for the accepted calls to finish. Returns the calls still running at the end.
    pub fn drain(mut self, grace: Duration) -> i64 {
        self.metrics.draining.store(true, Ordering::SeqCst);
        // Wake the accept thread (it sees the flag and returns, dropping the queue's sender:
        // workers finish what is queued, then exit), then remove the socket.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline
            && (self.metrics.in_flight().get() > 0 || self.metrics.queue().get() > 0)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left = self.metrics.in_flight().get() + self.metrics.queue().get();
        if left == 0 {
            for w in self.workers.drain(..) {
                let _ = w.join();
            }
        }
        left
    }
}

fn accept_loop(
    listener: &UnixListener,
    tx: &Sender<Job>,
    metrics: &Metrics,
    limits: Limits,
    outstanding: &AtomicUsize,
) {
    loop {
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        // Draining wakes this thread with a connection of its own after setting the flag.
        if metrics.draining.load(Ordering::SeqCst) {
            return;
        }
        let job = Job {
            conn,
            accepted: Instant::now(),
        };
        let capacity = limits.max_concurrent.max(1) + limits.queue_size;
        let admitted = outstanding.fetch_add(1, Ordering::SeqCst) < capacity;
        if admitted {
            metrics.queue().inc();
        }
        let refused = if admitted {
            tx.send(job).err().map(|e| {
                metrics.queue().dec();
                e.0
            })
        } else {
            Some(job)
        };
        match refused {
            None => {}
            Some(mut job) => {
                outstanding.fetch_sub(1, Ordering::SeqCst);
                // Read the request first (closing on unread data would reset the connection
                // before the shim reads the answer), briefly: a slow client gets no answer.
                let _ = job.conn.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = job.conn.set_write_timeout(Some(Duration::from_secs(1)));
                let verb = read_message::<Request>(&mut job.conn, MAX_REQUEST_BYTES)
                    .ok()
                    .and_then(|r| r.env.get("CNI_COMMAND").cloned())
                    .unwrap_or_default();
                let _ = write_message(&mut job.conn, &busy_response(limits));
                metrics.request(&verb, "busy", code::TRY_AGAIN_LATER, job.accepted.elapsed());
            }
        }
    }
}

/// A served call as the metrics count it: its verb, result, CNI code (read from the error the
/// answer carries), duration, and the phases this worker thread recorded for it.
fn finished(verb: &str, resp: &Response, took: Duration) -> crate::outcome::Outcome {
    let code = if resp.code == 0 {
        0
    } else {
        serde_json::from_str::<serde_json::Value>(&resp.stdout)
            .ok()
            .and_then(|v| v.get("code").and_then(serde_json::Value::as_u64))
            .and_then(|c| u32::try_from(c).ok())
            .unwrap_or(code::INTERNAL)
    };
    crate::outcome::Outcome {
        verb: verb.to_string(),
        result: if resp.code == 0 { "ok" } else { "error" }.into(),
        code,
        seconds: took.as_secs_f64(),
        phases: plexus_delegates::timing::phases()
            .into_iter()
            .map(|(n, d)| (n.to_string(), d.as_secs_f64()))
            .collect(),
        ..Default::default()
    }
}

fn worker(
    rx: &Mutex<Receiver<Job>>,
    metrics: &Metrics,
    handler: &Handler,
    outstanding: &AtomicUsize,
) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(mut job) = job else { return };
        // The call's phases (its closing log line) start with its wait in the queue and the
        // reading of its request.
        plexus_delegates::timing::reset();
        plexus_delegates::timing::record("queue", job.accepted.elapsed());
        metrics.queue().dec();
        metrics.in_flight().inc();
        let _ = job.conn.set_read_timeout(Some(Duration::from_secs(10)));
        let read = plexus_delegates::timing::phase("request_read");
        let request = read_message::<Request>(&mut job.conn, MAX_REQUEST_BYTES);
        drop(read);
        let (verb, resp) = match request {
            Ok(req) => {
                let verb = req.env.get("CNI_COMMAND").cloned().unwrap_or_default();
                (verb, handler(req))
            }
            Err(e) => (
                "unknown".to_string(),
                Response {
                    code: 1,
                    stdout: CniError::decode("cannot read the CNI request", e.to_string())
                        .with_version(plexus_conf::version::CURRENT)
                        .to_json(),
                },
            ),
        };
        let _ = write_message(&mut job.conn, &resp);
        metrics.in_flight().dec();
        outstanding.fetch_sub(1, Ordering::SeqCst);
        metrics.apply(&finished(&verb, &resp, job.accepted.elapsed()));
    }
}
