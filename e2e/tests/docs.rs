//! The user docs say nothing that does not work: every JSON block in `README.md` and `docs/*.md`
//! parses as what it shows — a plexus/Multus config, an sriov config, a network config, a
//! networks annotation or a network-status list. (YAML manifests in the docs are applied to the
//! real API server by the `real_admission` tier; the commands run in the demo and the tiers.)

mod common;

use common::{markdown_blocks as blocks, user_documents as documents};
use plexus_conf::k8s::network_status::NetworkStatus;
use plexus_conf::k8s::selection;
use plexus_conf::netconf::NetConfList;
use plexus_conf::plexus_config::PlexusConfig;
use serde_json::Value;

fn is_plexus(v: &Value) -> bool {
    let t = |o: &Value| {
        matches!(
            o.get("type").and_then(Value::as_str),
            Some("plexus" | "multus")
        )
    };
    t(v) || v
        .get("plugins")
        .and_then(Value::as_array)
        .is_some_and(|ps| ps.iter().any(t))
}

/// Check one block; `Err` says what it failed to be.
fn check(block: &str) -> Result<&'static str, String> {
    let v: Value = serde_json::from_str(block).map_err(|e| format!("not JSON: {e}"))?;
    if is_plexus(&v) {
        return PlexusConfig::parse(block.as_bytes())
            .map(|_| "plexus config")
            .map_err(|e| e.to_string());
    }
    if v.get("code").is_some() && v.get("msg").is_some() {
        return plexus_conf::error::CniError::parse(&v)
            .map(|_| "CNI error result")
            .ok_or_else(|| "not a CNI error result".to_string());
    }
    if v.get("type").and_then(Value::as_str) == Some("sriov") {
        return plexus_sriov::netconf::parse(
            block.as_bytes(),
            "",
            plexus_sriov::netconf::Purpose::Other,
        )
        .map(|_| "sriov config")
        .map_err(|e| e.to_string());
    }
    if let Value::Array(items) = &v {
        if items
            .iter()
            .all(|i| i.get("interface").is_some() || i.get("dns").is_some())
        {
            return serde_json::from_value::<Vec<NetworkStatus>>(v.clone())
                .map(|_| "network-status")
                .map_err(|e| e.to_string());
        }
        return selection::parse_selections(block, selection::NETWORKS_ANNOTATION)
            .map(|_| "networks annotation")
            .map_err(|e| e.to_string());
    }
    if let Some(m) = v.as_object().filter(|m| m.values().all(Value::is_array)) {
        if !m.is_empty() {
            return plexus_conf::k8s::fixed_ips::FixedIps::parse("docs", block)
                .map(|_| "fixed-ips mapping")
                .map_err(|e| e.to_string());
        }
    }
    NetConfList::parse(block.as_bytes())
        .map(|_| "network config")
        .map_err(|e| e.to_string())
}

#[test]
fn every_json_block_in_the_docs_is_what_it_shows() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (line, block) in blocks(&text, "json") {
            match check(&block) {
                Ok(_) => checked += 1,
                Err(e) => failures.push(format!("{}:{line}: {e}", doc.display())),
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(checked >= 7, "only {checked} JSON blocks found");
}

#[test]
fn the_block_finder_and_the_checks_can_fail() {
    let md = "x\n```json\n{\"a\":1}\n```\n```yaml\nk: v\n```\n";
    assert_eq!(blocks(md, "json"), vec![(3, "{\"a\":1}\n".to_string())]);
    assert!(
        check("{\"type\":\"plexus\"}").is_err(),
        "no default network"
    );
    assert!(check("{not json").is_err());
    assert!(check(r#"{"type":"sriov","deviceID":"nope"}"#).is_err());
}
