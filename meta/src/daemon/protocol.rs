//! The shim ↔ daemon wire format on the Unix socket: one request per connection. The shim
//! writes a JSON [`Request`] and shuts its write side; the daemon answers one JSON [`Response`]
//! and closes. No HTTP: both ends are plexus, and the shim stays a few system calls.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// The environment variables a CNI call is made of (forwarded by the shim, nothing else).
pub const CNI_ENV: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

/// Largest request the daemon reads: the stdin config limit plus room for the environment.
pub const MAX_REQUEST_BYTES: usize = plexus_conf::limits::MAX_STDIN_CONFIG_BYTES + 64 * 1024;

/// A CNI call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The `CNI_*` environment of the call.
    pub env: BTreeMap<String, String>,
    /// The network configuration (the runtime's stdin).
    pub stdin: String,
}

/// The daemon's answer: what the plugin would print, and its exit code.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Exit code.
    pub code: i32,
    /// Stdout (a CNI result or error, or empty).
    pub stdout: String,
}

/// Read one JSON message to the end of the stream, refusing more than `limit` bytes.
pub fn read_message<T: serde::de::DeserializeOwned>(
    r: &mut impl Read,
    limit: usize,
) -> std::io::Result<T> {
    let mut buf = Vec::new();
    r.take(limit as u64 + 1).read_to_end(&mut buf)?;
    if buf.len() > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("message larger than {limit} bytes"),
        ));
    }
    serde_json::from_slice(&buf)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Write one JSON message.
pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(msg)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    w.write_all(&bytes)?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shim and the daemon of a node are upgraded one after the other: a request or an
    /// answer with a field the other side does not know still decodes.
    #[test]
    fn unknown_fields_from_another_version_are_ignored() {
        let req: Request = read_message(
            &mut br#"{"env":{"CNI_COMMAND":"DEL"},"stdin":"{}","protocol":2}"#.as_slice(),
            1024,
        )
        .unwrap();
        assert_eq!(req.env["CNI_COMMAND"], "DEL");
        let resp: Response = read_message(
            &mut br#"{"code":0,"stdout":"","timings":{}}"#.as_slice(),
            1024,
        )
        .unwrap();
        assert_eq!(resp.code, 0);
    }

    #[test]
    fn round_trip_and_size_limit() {
        let req = Request {
            env: [("CNI_COMMAND".to_string(), "ADD".to_string())].into(),
            stdin: r#"{"cniVersion":"1.0.0"}"#.into(),
        };
        let mut buf = Vec::new();
        write_message(&mut buf, &req).unwrap();
        let back: Request = read_message(&mut buf.as_slice(), 1024).unwrap();
        assert_eq!(back, req);
        let e = read_message::<Request>(&mut buf.as_slice(), 10).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    }
}
