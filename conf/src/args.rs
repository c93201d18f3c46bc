//! `CNI_ARGS` (`K=V;K=V`) parsing with libcni's `IgnoreUnknown` rule.

use crate::error::{code, CniError};

/// Parsed `CNI_ARGS`, in their original order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

/// True for `1`/`true` (any case), as libcni's `UnmarshallableBool`.
pub fn is_truthy(v: &str) -> bool {
    v == "1" || v.eq_ignore_ascii_case("true")
}

impl CniArgs {
    /// Parse `K=V;K=V`. Empty segments are skipped; a segment without `=` is an error.
    /// Values may contain `=` (only the first one splits).
    /// Longer than [`crate::limits::MAX_CNI_ARGS_BYTES`] is an error (code 4).
    pub fn parse(s: &str) -> Result<Self, CniError> {
        crate::limits::check_cni_args(s.len())?;
        let mut pairs = Vec::new();
        for seg in s.split(';').filter(|seg| !seg.is_empty()) {
            let (k, v) = seg.split_once('=').ok_or_else(|| {
                CniError::new(
                    code::INVALID_ENV,
                    "invalid CNI_ARGS",
                    format!("pair {seg:?} has no '='"),
                )
            })?;
            if k.is_empty() {
                return Err(CniError::new(
                    code::INVALID_ENV,
                    "invalid CNI_ARGS",
                    format!("pair {seg:?} has an empty key"),
                ));
            }
            pairs.push((k.to_string(), v.to_string()));
        }
        Ok(CniArgs { pairs })
    }

    /// The value of a key (the last one wins, as libcni's loader does).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether `IgnoreUnknown` is truthy.
    pub fn ignore_unknown(&self) -> bool {
        self.get("IgnoreUnknown").is_some_and(is_truthy)
    }

    /// Fail on keys outside `known` unless `IgnoreUnknown` is set (libcni `LoadArgs`).
    pub fn check_known(&self, known: &[&str]) -> Result<(), CniError> {
        if self.ignore_unknown() {
            return Ok(());
        }
        let unknown: Vec<String> = self
            .pairs
            .iter()
            .filter(|(k, _)| k != "IgnoreUnknown" && !known.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(
                code::INVALID_ENV,
                "unknown CNI_ARGS",
                format!("{unknown:?} (set IgnoreUnknown=1 to allow them)"),
            ))
        }
    }

    /// All pairs in order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    /// Set a key, replacing an existing one in place.
    pub fn set(&mut self, key: &str, value: &str) {
        match self.pairs.iter_mut().find(|(k, _)| k == key) {
            Some(p) => p.1 = value.to_string(),
            None => self.pairs.push((key.to_string(), value.to_string())),
        }
    }

    /// Render as `K=V;K=V`.
    pub fn render(&self) -> String {
        self.pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubelet_args_in_any_order() {
        let a = CniArgs::parse("K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1;IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=pg-0").unwrap();
        assert_eq!(a.get("K8S_POD_NAMESPACE"), Some("db"));
        assert_eq!(a.get("K8S_POD_NAME"), Some("pg-0"));
        assert!(a.ignore_unknown());
        assert!(a.check_known(&[]).is_ok());
    }

    #[test]
    fn unknown_keys_fail_without_ignore_unknown() {
        let a = CniArgs::parse("FOO=bar").unwrap();
        let e = a.check_known(&["IP"]).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.details.contains("FOO=bar"));
        assert!(CniArgs::parse("IgnoreUnknown=TRUE;FOO=bar")
            .unwrap()
            .check_known(&[])
            .is_ok());
        assert!(!CniArgs::parse("IgnoreUnknown=0;FOO=bar")
            .unwrap()
            .ignore_unknown());
    }

    #[test]
    fn malformed_pairs() {
        assert!(CniArgs::parse("novalue").is_err());
        assert!(CniArgs::parse("=v").is_err());
        let a = CniArgs::parse(";;A=b=c;").unwrap();
        assert_eq!(a.get("A"), Some("b=c"));
        assert_eq!(a.render(), "A=b=c");
    }

    #[test]
    fn oversized_cni_args_name_the_limit() {
        let max = crate::limits::MAX_CNI_ARGS_BYTES;
        let ok = format!("A={}", "x".repeat(max - 2));
        assert_eq!(
            CniArgs::parse(&ok).unwrap().get("A").unwrap().len(),
            max - 2
        );
        let e = CniArgs::parse(&format!("{ok}y")).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert_eq!(e.msg, "CNI_ARGS is too large");
        assert_eq!(
            e.details,
            format!("{} bytes, the limit is {max} bytes", max + 1)
        );
    }

    #[test]
    fn set_replaces_in_place() {
        let mut a = CniArgs::parse("A=1;B=2").unwrap();
        a.set("A", "3");
        a.set("C", "4");
        assert_eq!(a.render(), "A=3;B=2;C=4");
    }
}
