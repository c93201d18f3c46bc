//! NetworkAttachmentDefinition configs (NPWG spec 3.4): `spec.config` as a single config or a
//! conflist, with the NAD's name injected when the config has none, or (empty spec) the on-disk
//! config of that name, `.conflist` files preferred over `.conf`/`.json`.

use crate::error::{code, CniError};
use crate::limits;
use crate::netconf::NetConfList;
use serde_json::Value;

/// Parse a NAD's `spec.config`. `Ok(None)` means the spec is empty and the config must come
/// from the config directory by name.
pub fn config_from_spec(
    ns: &str,
    name: &str,
    spec_config: &str,
) -> Result<Option<NetConfList>, CniError> {
    let ctx = || format!("network {ns}/{name}");
    limits::check(
        "spec.config",
        spec_config.len(),
        limits::MAX_NAD_CONFIG_BYTES,
        code::INVALID_CONFIG,
    )
    .map_err(|e| e.context(ctx()))?;
    if spec_config.trim().is_empty() {
        return Ok(None);
    }
    let mut v: Value = serde_json::from_str(spec_config).map_err(|e| {
        CniError::invalid_config(
            format!("{}: spec.config is not valid JSON", ctx()),
            e.to_string(),
        )
    })?;
    let Some(obj) = v.as_object_mut() else {
        return Err(CniError::invalid_config(
            format!("{}: spec.config is not a JSON object", ctx()),
            "",
        ));
    };
    if obj
        .get("name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        obj.insert("name".into(), Value::String(name.to_string()));
    }
    if !obj.contains_key("plugins")
        && obj
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        return Err(CniError::invalid_config(
            format!("{}: spec.config has neither 'type' nor 'plugins'", ctx()),
            "a single-plugin config needs 'type'; a conflist needs 'plugins'",
        ));
    }
    NetConfList::from_value(v)
        .map(Some)
        .map_err(|e| e.context(ctx()))
}

/// Pick the config named `name` from `(file name, bytes)` pairs of a config directory: files are
/// taken in name order, `.conflist` before `.conf`/`.json`; unparsable files are skipped.
pub fn find_by_name(name: &str, files: &[(String, Vec<u8>)]) -> Option<NetConfList> {
    let mut sorted: Vec<&(String, Vec<u8>)> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for want_list in [true, false] {
        for (fname, bytes) in &sorted {
            let is_list = fname.ends_with(".conflist");
            let is_conf = fname.ends_with(".conf") || fname.ends_with(".json");
            if (want_list && !is_list) || (!want_list && !is_conf) {
                continue;
            }
            if let Ok(l) = NetConfList::parse(bytes) {
                // A file without a name cannot be looked up by one (as in Multus).
                if !l.name_derived && l.name == name {
                    return Some(l);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injects_name_and_accepts_both_forms() {
        let l = config_from_spec(
            "db",
            "mv",
            r#"{"cniVersion":"1.0.0","type":"macvlan","master":"m0"}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.name, "mv");
        let l = config_from_spec("db", "chain", r#"{"cniVersion":"1.0.0","name":"own","plugins":[{"type":"macvlan"},{"type":"tuning"}]}"#)
            .unwrap()
            .unwrap();
        assert_eq!(l.name, "own");
        assert_eq!(l.plugins.len(), 2);
        assert!(config_from_spec("db", "empty", "  ").unwrap().is_none());
    }

    #[test]
    fn bad_specs_name_the_network() {
        for bad in [
            "{",
            "[1]",
            r#"{"cniVersion":"1.0.0"}"#,
            r#"{"type":"../x"}"#,
        ] {
            let e = config_from_spec("db", "broken", bad).unwrap_err();
            assert_eq!(e.code, 7, "{bad}");
            assert!(e.msg.contains("db/broken"), "{e}");
        }
    }

    #[test]
    fn oversized_spec_config_names_the_limit() {
        let pad = " ".repeat(limits::MAX_NAD_CONFIG_BYTES);
        let cfg = format!(r#"{{"cniVersion":"1.0.0","type":"macvlan"}}{pad}"#);
        let e = config_from_spec("db", "huge", &cfg).unwrap_err();
        assert_eq!(e.code, 7);
        assert_eq!(e.msg, "network db/huge: spec.config is too large");
        assert_eq!(
            e.details,
            format!(
                "{} bytes, the limit is {} bytes",
                cfg.len(),
                limits::MAX_NAD_CONFIG_BYTES
            )
        );
        let fits = &cfg[..limits::MAX_NAD_CONFIG_BYTES];
        assert!(config_from_spec("db", "huge", fits).unwrap().is_some());
    }

    #[test]
    fn on_disk_lookup_prefers_conflist_in_name_order() {
        let files = vec![
            (
                "10-a.conf".to_string(),
                br#"{"name":"net","type":"bridge"}"#.to_vec(),
            ),
            (
                "20-b.conflist".to_string(),
                br#"{"name":"net","plugins":[{"type":"macvlan"}]}"#.to_vec(),
            ),
            (
                "05-c.conflist".to_string(),
                br#"{"name":"other","plugins":[{"type":"ptp"}]}"#.to_vec(),
            ),
            ("01-bad.conflist".to_string(), b"{garbage".to_vec()),
        ];
        assert_eq!(
            find_by_name("net", &files).unwrap().plugins[0].plugin_type(),
            "macvlan"
        );
        assert_eq!(
            find_by_name("other", &files).unwrap().plugins[0].plugin_type(),
            "ptp"
        );
        assert!(find_by_name("missing", &files).is_none());
    }
}
