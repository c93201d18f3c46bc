//! A bounded TCP transfer between two network namespaces, timed: what a shaped interface is
//! measured with (the bandwidth plugin's rate, seen by packets).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// Runs `f` on a thread that has entered the network namespace at `netns` (None: this one).
fn in_netns<T: Send>(
    netns: Option<&Path>,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(p) = netns {
                let file = std::fs::File::open(p)?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("transfer thread panicked")))
    })
}

/// Sends `bytes` from a client in `client_ns` to a server on `server` (an address of
/// `server_ns`), and returns the time from connect until the server has read the last byte
/// (it closes then; the client waits for that). Times out after `limit`.
pub fn timed(
    server_ns: Option<&Path>,
    server: SocketAddr,
    client_ns: Option<&Path>,
    bytes: usize,
    limit: Duration,
) -> std::io::Result<Duration> {
    let listener = in_netns(server_ns, || TcpListener::bind(server))?;
    let port = listener.local_addr()?.port();
    std::thread::scope(|s| {
        let srv = s.spawn(move || -> std::io::Result<usize> {
            let (mut c, _) = listener.accept()?;
            c.set_read_timeout(Some(limit))?;
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = 0;
            loop {
                match c.read(&mut buf)? {
                    0 => break,
                    n => got += n,
                }
            }
            Ok(got)
        });
        let to = SocketAddr::new(server.ip(), port);
        let took = in_netns(client_ns, || {
            let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
            c.set_write_timeout(Some(limit))?;
            c.set_read_timeout(Some(limit))?;
            let start = Instant::now();
            let chunk = vec![0x5au8; 64 * 1024];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(chunk.len());
                c.write_all(&chunk[..n])?;
                left -= n;
            }
            c.shutdown(std::net::Shutdown::Write)?;
            // The server closes once it has read everything: EOF here means all arrived.
            let mut end = [0u8; 1];
            let _ = c.read(&mut end)?;
            Ok(start.elapsed())
        });
        let got = srv
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("server panicked")))?;
        if got != bytes {
            return Err(std::io::Error::other(format!(
                "server got {got} of {bytes} bytes"
            )));
        }
        took
    })
}

/// The rate of a transfer of `bytes` in `took`, in bits per second (TCP payload).
pub fn bits_per_second(bytes: usize, took: Duration) -> f64 {
    bytes as f64 * 8.0 / took.as_secs_f64()
}

/// The steady rate of a shaped path, in bits per second: a client in `client_ns` sends without
/// end to a server on `server` (in `server_ns`), which counts what arrives in 1 s windows. A
/// token bucket first lets its burst through at the path's own speed (how much depends on the
/// runtime: containerd's is ~190 MB); once three windows in a row each carry at most twice
/// `asked` bits per second the bucket is empty, and their mean is the answer. The server then
/// closes, which stops the client. Fails after `limit`.
pub fn steady_shaped_rate(
    server_ns: Option<&Path>,
    server: SocketAddr,
    client_ns: Option<&Path>,
    asked: f64,
    limit: Duration,
) -> std::io::Result<f64> {
    let listener = in_netns(server_ns, || TcpListener::bind(server))?;
    let port = listener.local_addr()?.port();
    std::thread::scope(|s| {
        let srv = s.spawn(move || -> std::io::Result<f64> {
            let (mut c, _) = listener.accept()?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut buf = vec![0u8; 256 * 1024];
            let start = Instant::now();
            let (mut window_start, mut window_bytes) = (Instant::now(), 0usize);
            let mut shaped: Vec<f64> = Vec::new();
            while start.elapsed() < limit {
                let n = c.read(&mut buf)?;
                if n == 0 {
                    return Err(std::io::Error::other("the sender stopped"));
                }
                window_bytes += n;
                let w = window_start.elapsed();
                if w >= Duration::from_secs(1) {
                    let rate = window_bytes as f64 * 8.0 / w.as_secs_f64();
                    if rate <= 2.0 * asked {
                        shaped.push(rate);
                    } else {
                        shaped.clear();
                    }
                    if shaped.len() == 3 {
                        return Ok(shaped.iter().sum::<f64>() / 3.0);
                    }
                    (window_start, window_bytes) = (Instant::now(), 0);
                }
            }
            Err(std::io::Error::other(format!(
                "not shaped within {limit:?} (last windows {shaped:?})"
            )))
        });
        let to = SocketAddr::new(server.ip(), port);
        let _ = in_netns(client_ns, || {
            let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
            c.set_write_timeout(Some(limit))?;
            let chunk = vec![0x5au8; 64 * 1024];
            // Until the server closes (a write error then).
            while c.write_all(&chunk).is_ok() {}
            Ok(())
        });
        srv.join()
            .unwrap_or_else(|_| Err(std::io::Error::other("server panicked")))
    })
}
