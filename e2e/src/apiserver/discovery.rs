//! Static discovery documents: `/version`, `/api`, `/apis`, and per group-version resource lists.

use std::net::SocketAddr;

use serde_json::{json, Value};

use super::resources::Resource;
use super::routes::Route;

/// The discovery body for a discovery route, if it is one.
pub fn answer(route: &Route, addr: SocketAddr) -> Option<Value> {
    Some(match route {
        Route::Version => json!({
            "major": "1",
            "minor": "34",
            "gitVersion": "v1.34.0-plexus-test",
            "gitCommit": "0000000000000000000000000000000000000000",
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.24.0",
            "compiler": "gc",
            "platform": "linux/amd64"
        }),
        Route::CoreVersions => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string() }]
        }),
        Route::Groups => {
            let groups: Vec<Value> = ["events.k8s.io", "k8s.cni.cncf.io"]
                .iter()
                .map(|g| {
                    let gv = json!({ "groupVersion": format!("{g}/v1"), "version": "v1" });
                    json!({ "name": g, "versions": [gv.clone()], "preferredVersion": gv })
                })
                .collect();
            json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
        }
        Route::ResourceList { group } => resource_list(group),
        _ => return None,
    })
}

fn resource_list(group: &str) -> Value {
    let mut resources = Vec::new();
    for r in Resource::ALL.into_iter().filter(|r| r.group() == group) {
        let verbs: &[&str] = match r {
            Resource::Namespace => &["create", "get", "list"],
            _ => &["create", "delete", "get", "list", "patch", "update"],
        };
        resources.push(json!({
            "name": r.plural(),
            "singularName": r.singular(),
            "namespaced": r.namespaced(),
            "kind": r.kind(),
            "verbs": verbs,
            "shortNames": r.short_names(),
        }));
        if r.has_status() {
            resources.push(json!({
                "name": format!("{}/status", r.plural()),
                "singularName": "",
                "namespaced": r.namespaced(),
                "kind": r.kind(),
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        "v1".to_string()
    } else {
        format!("{group}/v1")
    };
    json!({ "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources })
}
