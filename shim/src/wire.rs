//! What the shim reads from the config and says on the daemon's socket: the wire format of
//! `meta/src/daemon/protocol.rs` (one JSON request per connection, `{"env":{…},"stdin":"…"}`,
//! the write side shut; one JSON answer `{"code":N,"stdout":"…"}`, then the daemon closes).

use crate::json::{self, Value};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The environment variables a CNI call is made of (as `protocol::CNI_ENV`).
pub const CNI_ENV: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

/// Largest answer read from the daemon (as `meta/src/shim.rs`).
const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// The config's `daemonSocket`, when it selects daemon mode exactly as `plexus` would read it
/// (`ShimConfig::from_stdin`: a valid JSON object whose `daemonSocket`, `daemonUnavailable`
/// and `kubeconfig` are strings when present, each at most once, and `daemonSocket` not
/// empty). `None` otherwise: `plexus` then decides.
pub fn daemon_socket(stdin: &[u8]) -> Option<String> {
    let members = json::object_members(stdin)?;
    let mut socket = None;
    for key in ["daemonSocket", "daemonUnavailable", "kubeconfig"] {
        let mut seen = members.iter().filter(|(k, _)| k == key);
        let first = seen.next();
        if seen.next().is_some() {
            return None;
        }
        match first {
            None => {}
            Some((_, Value::Str(s))) if key == "daemonSocket" => socket = Some(s.clone()),
            Some((_, Value::Str(_))) => {}
            Some(_) => return None,
        }
    }
    socket.filter(|s| !s.is_empty())
}

/// The config's `cniVersion` (for an error of the shim's own), else the newest.
pub fn cni_version(stdin: &[u8]) -> String {
    top_level_str(stdin, "cniVersion").unwrap_or_else(|| "1.1.0".into())
}

/// `network N, pod NS/NAME` for the shim's own errors, from the config and `CNI_ARGS`.
pub fn call_names(stdin: &[u8]) -> String {
    let net = top_level_str(stdin, "name").unwrap_or_else(|| "?".into());
    let args = std::env::var("CNI_ARGS").unwrap_or_default();
    let arg = |k: &str| {
        args.split(';')
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "network {net}, pod {}/{}",
        arg("K8S_POD_NAMESPACE"),
        arg("K8S_POD_NAME")
    )
}

fn top_level_str(stdin: &[u8], key: &str) -> Option<String> {
    json::object_members(stdin)?
        .into_iter()
        .find_map(|(k, v)| match v {
            Value::Str(s) if k == key => Some(s),
            _ => None,
        })
}

/// The request for a call with environment `env` and config `stdin`.
pub fn request(env: &[(String, String)], stdin: &str) -> Vec<u8> {
    let mut out = String::with_capacity(stdin.len() + 512);
    out.push_str("{\"env\":{");
    for (i, (k, v)) in env.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json::push_str(&mut out, k);
        out.push(':');
        json::push_str(&mut out, v);
    }
    out.push_str("},\"stdin\":");
    json::push_str(&mut out, stdin);
    out.push('}');
    out.into_bytes()
}

/// The daemon's answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Answer {
    /// The plugin's exit code.
    pub code: i32,
    /// What the plugin prints (a CNI result or error, or empty).
    pub stdout: String,
}

/// Decode an answer.
pub fn answer(bytes: &[u8]) -> Option<Answer> {
    let (mut code, mut stdout) = (None, None);
    for (k, v) in json::object_members(bytes)? {
        match (k.as_str(), v) {
            ("code", Value::Int(c)) => code = i32::try_from(c).ok(),
            ("stdout", Value::Str(s)) => stdout = Some(s),
            _ => {}
        }
    }
    Some(Answer {
        code: code?,
        stdout: stdout?,
    })
}

/// How forwarding failed.
#[derive(Debug)]
pub enum ForwardError {
    /// Nothing listens on the socket: nothing was sent.
    Unreachable(std::io::Error),
    /// The daemon took the call but gave no (readable) answer.
    NoAnswer(std::io::Error),
}

/// Send one request to the daemon at `socket` and read its answer.
pub fn forward(socket: &str, req: &[u8]) -> Result<Answer, ForwardError> {
    let mut conn = UnixStream::connect(socket).map_err(ForwardError::Unreachable)?;
    let no_answer = ForwardError::NoAnswer;
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    conn.write_all(req).map_err(no_answer)?;
    conn.shutdown(std::net::Shutdown::Write)
        .map_err(no_answer)?;
    let mut buf = Vec::new();
    (&mut conn)
        .take(MAX_ANSWER_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(no_answer)?;
    if buf.len() as u64 > MAX_ANSWER_BYTES {
        return Err(no_answer(std::io::Error::other(format!(
            "answer larger than {MAX_ANSWER_BYTES} bytes"
        ))));
    }
    answer(&buf).ok_or_else(|| {
        let what = if buf.is_empty() {
            "the connection closed without an answer".to_string()
        } else {
            format!("invalid answer ({} bytes)", buf.len())
        };
        no_answer(std::io::Error::other(what))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemon_mode_is_selected_as_plexus_selects_it() {
        let s = |d: &str| daemon_socket(d.as_bytes());
        assert_eq!(
            s(
                r#"{"type":"plexus-shim","daemonSocket":"/run/plexus/plexus.sock","kubeconfig":"/k"}"#
            ),
            Some("/run/plexus/plexus.sock".into())
        );
        assert_eq!(s(r#"{"type":"plexus"}"#), None);
        assert_eq!(s(r#"{"daemonSocket":""}"#), None);
        // serde_json would refuse these ShimConfigs, so plexus would run thin: so do we.
        assert_eq!(s(r#"{"daemonSocket":5}"#), None);
        assert_eq!(s(r#"{"daemonSocket":"/s","kubeconfig":null}"#), None);
        assert_eq!(s(r#"{"daemonSocket":"/s","daemonUnavailable":true}"#), None);
        assert_eq!(s(r#"{"daemonSocket":"/s","daemonSocket":"/t"}"#), None);
        assert_eq!(s(r#"{"daemonSocket":"/s""#), None);
        // Nested keys are not the config's.
        assert_eq!(s(r#"{"plugins":[{"daemonSocket":"/s"}]}"#), None);
    }

    #[test]
    fn request_and_answer_match_the_daemons_format() {
        let env = vec![
            ("CNI_COMMAND".to_string(), "ADD".to_string()),
            ("CNI_ARGS".to_string(), "K8S_POD_NAME=a\"b".to_string()),
        ];
        let req = request(&env, "{\"cniVersion\":\"1.0.0\"}\n");
        assert_eq!(
            String::from_utf8(req).unwrap(),
            r#"{"env":{"CNI_COMMAND":"ADD","CNI_ARGS":"K8S_POD_NAME=a\"b"},"stdin":"{\"cniVersion\":\"1.0.0\"}\n"}"#
        );
        assert_eq!(
            answer(br#"{"code":1,"stdout":"{\"code\":11}"}"#),
            Some(Answer {
                code: 1,
                stdout: r#"{"code":11}"#.into()
            })
        );
        assert_eq!(answer(br#"{"code":"1","stdout":""}"#), None);
        assert_eq!(answer(br#"{"stdout":""}"#), None);
        assert_eq!(answer(b""), None);
    }

    #[test]
    fn forwarding_tells_unreachable_from_no_answer() {
        let dir = std::env::temp_dir().join(format!("plexus-shim-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.sock");
        let p = path.to_str().unwrap().to_string();
        assert!(matches!(
            forward(&p, b"{}"),
            Err(ForwardError::Unreachable(_))
        ));
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let t = std::thread::spawn(move || {
            // First call: read it, answer; second: close without answering.
            for answer in [Some(r#"{"code":0,"stdout":"ok"}"#), None] {
                let (mut c, _) = l.accept().unwrap();
                let mut req = String::new();
                c.read_to_string(&mut req).unwrap();
                assert_eq!(req, "{\"env\":{}}");
                if let Some(a) = answer {
                    c.write_all(a.as_bytes()).unwrap();
                }
            }
        });
        let a = forward(&p, b"{\"env\":{}}").unwrap();
        assert_eq!((a.code, a.stdout.as_str()), (0, "ok"));
        match forward(&p, b"{\"env\":{}}") {
            Err(ForwardError::NoAnswer(e)) => assert!(e.to_string().contains("without an answer")),
            other => panic!("{other:?}"),
        }
        t.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
