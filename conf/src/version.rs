//! CNI specification versions: parsing, bands, and negotiation.

use crate::error::{code, CniError};
use std::fmt;

/// Every spec version Plexus speaks, oldest first.
pub const SUPPORTED: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The newest spec version Plexus implements.
pub const CURRENT: &str = "1.1.0";

/// A CNI spec version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.1.0
    V010,
    /// 0.2.0
    V020,
    /// 0.3.0
    V030,
    /// 0.3.1
    V031,
    /// 0.4.0
    V040,
    /// 1.0.0
    V100,
    /// 1.1.0
    V110,
}

/// The result-format families: conversion inside a band only relabels the version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Band {
    /// 0.1.0 / 0.2.0: `ip4`/`ip6` objects.
    Legacy,
    /// 0.3.0 / 0.3.1 / 0.4.0: `ips` with `version`.
    V03,
    /// 1.0.0 / 1.1.0.
    V1,
}

impl CniVersion {
    /// Parse a version string; an empty string means 0.1.0 as in libcni.
    pub fn parse(s: &str) -> Result<Self, CniError> {
        Ok(match s {
            "" | "0.1.0" => CniVersion::V010,
            "0.2.0" => CniVersion::V020,
            "0.3.0" => CniVersion::V030,
            "0.3.1" => CniVersion::V031,
            "0.4.0" => CniVersion::V040,
            "1.0.0" => CniVersion::V100,
            "1.1.0" => CniVersion::V110,
            other => {
                return Err(CniError::new(
                    code::INCOMPATIBLE_VERSION,
                    format!("unsupported CNI version {other:?}"),
                    format!("supported versions: {}", SUPPORTED.join(", ")),
                ))
            }
        })
    }

    /// The version string.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V010 => "0.1.0",
            CniVersion::V020 => "0.2.0",
            CniVersion::V030 => "0.3.0",
            CniVersion::V031 => "0.3.1",
            CniVersion::V040 => "0.4.0",
            CniVersion::V100 => "1.0.0",
            CniVersion::V110 => "1.1.0",
        }
    }

    /// The result-format band this version belongs to.
    pub fn band(self) -> Band {
        match self {
            CniVersion::V010 | CniVersion::V020 => Band::Legacy,
            CniVersion::V030 | CniVersion::V031 | CniVersion::V040 => Band::V03,
            CniVersion::V100 | CniVersion::V110 => Band::V1,
        }
    }

    /// Whether CHECK exists (0.4.0+).
    pub fn has_check(self) -> bool {
        self >= CniVersion::V040
    }

    /// Whether STATUS and GC exist (1.1.0+).
    pub fn has_status_gc(self) -> bool {
        self >= CniVersion::V110
    }
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Compare two version strings numerically (unknown parts count as 0).
pub fn compare(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |s: &str| -> Vec<u64> { s.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a).cmp(&parts(b))
}

/// Pick the version to use for a conflist: the highest of `cniVersion` and `cniVersions` that
/// Plexus implements and that every plugin in `plugin_supports` also lists.
/// Versions newer than Plexus implements are dropped first, as libcni does.
pub fn negotiate(
    cni_version: &str,
    cni_versions: &[String],
    plugin_supports: &[Vec<String>],
) -> Result<CniVersion, CniError> {
    let mut candidates: Vec<&str> = cni_versions.iter().map(String::as_str).collect();
    if !cni_version.is_empty() && !candidates.contains(&cni_version) {
        candidates.push(cni_version);
    }
    let mut best: Option<CniVersion> = None;
    for c in &candidates {
        let Ok(v) = CniVersion::parse(c) else {
            continue;
        };
        if !plugin_supports
            .iter()
            .all(|s| s.iter().any(|p| p == v.as_str()))
        {
            continue;
        }
        if best.is_none_or(|b| v > b) {
            best = Some(v);
        }
    }
    best.ok_or_else(|| {
        CniError::new(
            code::INCOMPATIBLE_VERSION,
            "no CNI version is supported by plexus and every plugin of the network",
            format!(
                "config asks for {:?}; plugins support {:?}",
                candidates, plugin_supports
            ),
        )
    })
}

/// What can be known about a conflist's version before any plugin runs: with only
/// `cniVersion`, that plexus implements it (it is used as written); with `cniVersions`, that
/// plexus implements at least one of the candidates (the plugins are asked at run time). A
/// network failing this would fail its ADD after the networks before it ran, and its own
/// rollback DEL too, so the plan refuses it first (code 1).
pub fn precheck(cni_version: &str, cni_versions: &[String]) -> Result<(), CniError> {
    if cni_versions.is_empty() {
        return CniVersion::parse(cni_version).map(drop);
    }
    let candidates = cni_versions
        .iter()
        .map(String::as_str)
        .chain((!cni_version.is_empty()).then_some(cni_version));
    if candidates.clone().any(|c| CniVersion::parse(c).is_ok()) {
        return Ok(());
    }
    Err(CniError::new(
        code::INCOMPATIBLE_VERSION,
        "no CNI version of the network is supported by plexus",
        format!(
            "config asks for {:?}; supported versions: {}",
            candidates.collect::<Vec<_>>(),
            SUPPORTED.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_supported_version() {
        for s in SUPPORTED {
            assert_eq!(CniVersion::parse(s).unwrap().as_str(), *s);
        }
        assert_eq!(CniVersion::parse("").unwrap(), CniVersion::V010);
        let e = CniVersion::parse("2.0.0").unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.msg.contains("2.0.0"));
    }

    #[test]
    fn bands_and_features() {
        assert_eq!(CniVersion::V031.band(), Band::V03);
        assert_eq!(CniVersion::V110.band(), Band::V1);
        assert!(!CniVersion::V031.has_check());
        assert!(CniVersion::V040.has_check());
        assert!(CniVersion::V110.has_status_gc() && !CniVersion::V100.has_status_gc());
    }

    #[test]
    fn negotiation_picks_highest_common() {
        let debian: Vec<String> = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let v = negotiate(
            "1.1.0",
            &["1.0.0".into(), "0.4.0".into()],
            std::slice::from_ref(&debian),
        )
        .unwrap();
        assert_eq!(v, CniVersion::V100);
        // Versions newer than we implement are ignored, not an error.
        let v = negotiate("0.4.0", &["9.9.9".into()], std::slice::from_ref(&debian)).unwrap();
        assert_eq!(v, CniVersion::V040);
        let e = negotiate("1.1.0", &[], &[debian]).unwrap_err();
        assert_eq!(e.code, 1);
    }

    #[test]
    fn compares_numerically() {
        assert!(compare("0.10.0", "0.4.0").is_gt());
        assert!(compare("1.0.0", "1.0.0").is_eq());
    }

    #[test]
    fn precheck_needs_one_version_plexus_implements() {
        assert!(precheck("1.0.0", &[]).is_ok());
        assert!(precheck("", &[]).is_ok());
        let e = precheck("9.9.9", &[]).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.msg.contains("9.9.9"), "{e}");
        // With cniVersions one usable candidate is enough (negotiation picks it later).
        assert!(precheck("9.9.9", &["1.0.0".into()]).is_ok());
        assert!(precheck("", &["2.0.0".into(), "0.4.0".into()]).is_ok());
        let e = precheck("3.0.0", &["2.0.0".into()]).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(
            e.details.contains("2.0.0") && e.details.contains("3.0.0"),
            "{e}"
        );
    }
}
