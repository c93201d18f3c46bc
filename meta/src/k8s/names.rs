//! Object names that go into API paths: checked as Kubernetes names, then percent-encoded.
//!
//! `K8S_POD_NAMESPACE` and `K8S_POD_NAME` come from the runtime's `CNI_ARGS`; NAD and claim
//! names come from pod annotations and status. None of them may steer a request to another
//! object: a value with `/`, `?`, `%`, `..` or any character outside a DNS-1123 name is refused
//! before a request is built, and every path segment is percent-encoded anyway.

use std::borrow::Cow;

/// Longest DNS-1123 label (namespaces).
const MAX_LABEL: usize = 63;
/// Longest DNS-1123 subdomain (most object names, pods included).
const MAX_SUBDOMAIN: usize = 253;

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?` of at most 63 characters.
fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let edge = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && edge(b.first())
        && edge(b.last())
        && b.iter().all(inner)
}

/// Why `ns` is not a namespace name (a DNS-1123 label), if it is not.
pub fn namespace_problem(ns: &str) -> Option<String> {
    if is_label(ns) {
        return None;
    }
    Some(format!(
        "{ns:?} is not a valid namespace name: a DNS-1123 label (at most {MAX_LABEL} lower-case \
         letters, digits and '-', starting and ending with a letter or digit)"
    ))
}

/// Why `name` is not an object name (a DNS-1123 subdomain), if it is not.
pub fn name_problem(name: &str) -> Option<String> {
    if name.len() <= MAX_SUBDOMAIN && name.split('.').all(is_label) {
        return None;
    }
    Some(format!(
        "{name:?} is not a valid object name: a DNS-1123 subdomain (at most {MAX_SUBDOMAIN} \
         characters, dot-separated labels of lower-case letters, digits and '-')"
    ))
}

/// Why `ns/name` cannot be addressed, if it cannot: the namespace's problem first.
pub fn ref_problem(ns: &str, name: &str) -> Option<String> {
    namespace_problem(ns).or_else(|| name_problem(name))
}

/// `s` as one URL path segment: every byte outside RFC 3986's unreserved set is
/// percent-encoded (so `/`, `?`, `#` and `%` can never end or extend the segment).
pub fn segment(s: &str) -> Cow<'_, str> {
    let unreserved = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~');
    if s.bytes().all(unreserved) && s != "." && s != ".." {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() * 3);
    for c in s.bytes() {
        // `.` and `..` alone are path navigation: encode their dots too.
        if unreserved(c) && !(c == b'.' && (s == "." || s == "..")) {
            out.push(char::from(c));
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_labels() {
        for ok in ["db", "kube-system", "a", "0", "a-0", &"n".repeat(63)] {
            assert!(namespace_problem(ok).is_none(), "{ok}");
        }
        for bad in [
            "",
            "Db",
            "-a",
            "a-",
            "a.b",
            "a/b",
            "..",
            "a?b",
            "a%2Fb",
            "ä",
            &"n".repeat(64),
        ] {
            let p = namespace_problem(bad).unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(p.contains("DNS-1123 label"), "{p}");
        }
    }

    #[test]
    fn object_names_are_subdomains() {
        let longest = format!("{0}.{0}.{0}.{1}", "a".repeat(63), "b".repeat(61));
        assert_eq!(longest.len(), 253);
        for ok in ["pg-0", "etcd-node-1.example.com", "a", &longest] {
            assert!(name_problem(ok).is_none(), "{ok}");
        }
        for bad in [
            "",
            "..",
            ".",
            "a..b",
            ".a",
            "a.",
            "a/b",
            "../../secrets/x",
            "p?dryRun=All",
            "p#x",
            "P",
            "a_b",
            "a b",
            &"a".repeat(64),
            &format!("{longest}b"),
        ] {
            assert!(name_problem(bad).is_some(), "{bad:?} accepted");
        }
        assert!(ref_problem("db", "pg-0").is_none());
        assert!(ref_problem("db/x", "pg-0").unwrap().contains("namespace"));
        assert!(ref_problem("db", "pg/0").unwrap().contains("object name"));
    }

    /// Every string of up to two characters from ASCII and a few multi-byte ones: the segment
    /// holds only unreserved characters and `%XX`, is never `.`/`..`, and decodes back; what the
    /// name checks accept is left as it is.
    #[test]
    fn every_short_string_encodes_to_one_segment_and_back() {
        let mut alphabet: Vec<char> = (0u8..128).map(char::from).collect();
        alphabet.extend(['ä', '€', '\u{1F600}', '\u{FFFD}']);
        let decode = |s: &str| {
            let b = s.as_bytes();
            let mut out = Vec::new();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).unwrap()
        };
        let mut inputs = vec![String::new()];
        for a in &alphabet {
            inputs.push(a.to_string());
            for b in &alphabet {
                inputs.push(format!("{a}{b}"));
            }
        }
        for s in &inputs {
            let seg = segment(s);
            assert!(
                seg.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-._~%".contains(&c)),
                "{s:?} -> {seg}"
            );
            assert!(seg != "." && seg != "..", "{s:?}");
            assert_eq!(decode(&seg), *s, "{s:?} -> {seg}");
            if name_problem(s).is_none() || namespace_problem(s).is_none() {
                assert_eq!(seg, *s, "a valid name is its own segment");
            }
        }
    }

    #[test]
    fn segments_cannot_escape() {
        assert_eq!(segment("pg-0.a_b~"), "pg-0.a_b~");
        assert_eq!(segment("a/b"), "a%2Fb");
        assert_eq!(segment("p?x=1#f"), "p%3Fx%3D1%23f");
        assert_eq!(segment("50%"), "50%25");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("."), "%2E");
        assert_eq!(segment("ä"), "%C3%A4");
        assert!(matches!(segment("pg-0"), Cow::Borrowed(_)));
    }
}
