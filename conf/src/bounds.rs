//! Bounds of the plexus config's numeric and path fields, checked at parse time so a value can
//! never reach `Instant + Duration` arithmetic (which panics on overflow) or a loop it would
//! make endless, and plexus' state never lands in the runtime's working directory.
//! `docs/limits.md` ("Config value bounds") lists them.

use crate::error::CniError;
use crate::plexus_config::PlexusConfig;
use std::path::Path;

/// `delegateTimeoutSeconds`: 1 s to 1 h.
pub const DELEGATE_TIMEOUT_SECONDS: (u64, u64) = (1, 3600);
/// `readinessTimeoutSeconds`: 0 (look once) to 1 h.
pub const READINESS_TIMEOUT_SECONDS: (u64, u64) = (0, 3600);
/// `podTimeoutMs`: 0 (one attempt) to 10 min.
pub const POD_TIMEOUT_MS: (u64, u64) = (0, 600_000);
/// `logOptions.maxAge`, days: up to 100 years.
pub const LOG_MAX_AGE_DAYS: (u64, u64) = (0, 36_500);
/// `logOptions.maxSize`, MB: up to 1 TiB.
pub const LOG_MAX_SIZE_MB: (u64, u64) = (0, 1 << 20);
/// `logOptions.maxBackups`: up to 1000 rotated files (rotation renames each one).
pub const LOG_MAX_BACKUPS: (u64, u64) = (0, 1000);

/// `field` is within `(min, max)`, or an invalid-config error (7) naming the field, the value
/// and the range.
pub fn check(field: &str, value: u64, (min, max): (u64, u64)) -> Result<(), CniError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(CniError::invalid_config(
        format!("{field} {value} is out of range"),
        format!("{field} must be between {min} and {max}"),
    ))
}

/// `field` is an absolute path (no `..` component), or an invalid-config error (7). `what`
/// says what the path is for.
pub fn absolute_dir(field: &str, value: &str, what: &str) -> Result<(), CniError> {
    let p = Path::new(value);
    let why = if value.is_empty() {
        "it is empty"
    } else if !p.is_absolute() {
        "it is a relative path"
    } else if p
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        "it contains '..'"
    } else {
        return Ok(());
    };
    Err(CniError::invalid_config(
        format!("{field} {value:?} is not usable: {why}"),
        format!(
            "{field} must be an absolute path: {what}; leave it out for the default {}",
            crate::plexus_config::DEFAULT_CNI_DIR
        ),
    ))
}

/// Every bounded field of a parsed plexus config.
pub fn check_config(c: &PlexusConfig) -> Result<(), CniError> {
    check(
        "delegateTimeoutSeconds",
        c.delegate_timeout_seconds,
        DELEGATE_TIMEOUT_SECONDS,
    )?;
    check(
        "readinessTimeoutSeconds",
        c.readiness_timeout_seconds,
        READINESS_TIMEOUT_SECONDS,
    )?;
    check("podTimeoutMs", c.pod_timeout_ms, POD_TIMEOUT_MS)?;
    if let Some(o) = &c.log_options {
        let opt = |v: Option<u32>| u64::from(v.unwrap_or(0));
        check("logOptions.maxAge", opt(o.max_age), LOG_MAX_AGE_DAYS)?;
        check("logOptions.maxSize", opt(o.max_size), LOG_MAX_SIZE_MB)?;
        check("logOptions.maxBackups", opt(o.max_backups), LOG_MAX_BACKUPS)?;
    }
    absolute_dir(
        "cniDir",
        &c.cni_dir,
        "plexus keeps its plans, cached results and locks there",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(extra: &str) -> Result<PlexusConfig, CniError> {
        PlexusConfig::parse(
            format!(r#"{{"name":"m","type":"plexus","clusterNetwork":"/c.conflist"{extra}}}"#)
                .as_bytes(),
        )
    }

    #[test]
    fn the_issue_values_are_clear_errors() {
        let e = parse(r#","readinessTimeoutSeconds":18446744073709551615"#).unwrap_err();
        assert_eq!(e.code, 7);
        assert_eq!(
            e.to_string(),
            "readinessTimeoutSeconds 18446744073709551615 is out of range: \
             readinessTimeoutSeconds must be between 0 and 3600"
        );
        for (extra, want) in [
            (r#","cniDir":"""#, "cniDir \"\" is not usable: it is empty"),
            (r#","cniDir":"state""#, "it is a relative path"),
            (r#","cniDir":"./state""#, "it is a relative path"),
            (r#","cniDir":"/var/lib/../tmp""#, "it contains '..'"),
            (r#","delegateTimeoutSeconds":0"#, "delegateTimeoutSeconds 0"),
            (r#","delegateTimeoutSeconds":3601"#, "between 1 and 3600"),
            (r#","podTimeoutMs":600001"#, "podTimeoutMs 600001"),
            (
                r#","logOptions":{"maxBackups":4294967295}"#,
                "logOptions.maxBackups 4294967295",
            ),
        ] {
            let e = parse(extra).unwrap_err();
            assert_eq!(e.code, 7, "{extra}");
            assert!(e.to_string().contains(want), "{extra}: {e}");
        }
        // Negative and non-integer values are decode errors naming the type.
        let e = parse(r#","podTimeoutMs":-1"#).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.details.contains("-1"), "{e}");
    }

    #[test]
    fn bounds_themselves_are_accepted() {
        for extra in [
            r#","delegateTimeoutSeconds":1,"readinessTimeoutSeconds":0,"podTimeoutMs":0"#,
            r#","delegateTimeoutSeconds":3600,"readinessTimeoutSeconds":3600,"podTimeoutMs":600000"#,
            r#","logOptions":{"maxAge":36500,"maxSize":1048576,"maxBackups":1000}"#,
            r#","cniDir":"/var/lib/cni/multus""#,
        ] {
            parse(extra).unwrap_or_else(|e| panic!("{extra}: {e}"));
        }
    }

    proptest! {
        /// Any u64 in any bounded numeric field: parsed when in range, otherwise a code-7
        /// error naming the field; never a panic.
        #[test]
        fn numeric_fields_are_checked(v in any::<u64>(), which in 0usize..3) {
            let (field, (min, max)) = [
                ("delegateTimeoutSeconds", DELEGATE_TIMEOUT_SECONDS),
                ("readinessTimeoutSeconds", READINESS_TIMEOUT_SECONDS),
                ("podTimeoutMs", POD_TIMEOUT_MS),
            ][which];
            match parse(&format!(r#","{field}":{v}"#)) {
                Ok(_) => prop_assert!(v >= min && v <= max),
                Err(e) => {
                    prop_assert!(v < min || v > max);
                    prop_assert_eq!(e.code, 7);
                    prop_assert!(e.msg.starts_with(field));
                }
            }
        }

        /// Any string as `cniDir`: accepted only when absolute and free of `..`.
        #[test]
        fn cni_dir_must_be_absolute(s in "[a-z./]{0,12}") {
            let ok = parse(&format!(r#","cniDir":{s:?}"#)).is_ok();
            let p = Path::new(&s);
            prop_assert_eq!(ok, p.is_absolute() && !s.split('/').any(|c| c == ".."));
        }
    }
}
