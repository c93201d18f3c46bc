//! The human text of a live [`Explanation`]: the verdict first (what ADD does or why it
//! fails), then the plan, the claims, and what ADD did on this node.

use super::live::Explanation;
use std::fmt::Write as _;

/// The explanation as text for a person at a terminal.
pub fn text(ex: &Explanation) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "pod {}{}",
        ex.pod,
        match (&ex.uid, &ex.node) {
            (Some(u), n) => format!("  uid {u}  node {}", n.as_deref().unwrap_or("-")),
            _ => String::new(),
        }
    );
    let _ = writeln!(o, "config {}  api {}", ex.config.display(), ex.api);
    match (&ex.failure, ex.verdict) {
        (Some(f), _) => {
            let _ = writeln!(o, "\nADD FAILS at {} (CNI error {}):", f.stage, f.code);
            let _ = writeln!(o, "  {}", f.msg);
            if !f.details.is_empty() {
                let _ = writeln!(o, "  {}", f.details);
            }
            if let Some(c) = &f.class {
                let _ = writeln!(o, "  NAD policy class: {c}");
            }
        }
        (None, "ok") => {
            let _ = writeln!(o, "\nADD would attach:");
        }
        (None, _) => {
            let _ = writeln!(o, "\nnot explained (see notes)");
        }
    }
    if let Some(plan) = &ex.plan {
        if ex.failure.is_some() {
            let _ = writeln!(o, "\nthe plan up to that point:");
        }
        for a in plan["attachments"].as_array().into_iter().flatten() {
            let types: Vec<&str> = a["delegates"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d["type"].as_str())
                .collect();
            let mut line = format!(
                "  {:<8} {}  [{}]",
                a["interface"].as_str().unwrap_or("?"),
                a["network"].as_str().unwrap_or("?"),
                types.join(", ")
            );
            if let Some(r) = a["resourceName"].as_str() {
                let _ = write!(line, "  resource {r}");
            }
            if let Some(d) = a["capabilityArgs"]["deviceID"].as_str() {
                let _ = write!(line, "  device {d}");
            }
            let _ = writeln!(o, "{line}");
        }
    }
    if !ex.claims.is_empty() {
        let _ = writeln!(o, "\nfixed addresses:");
        for c in &ex.claims {
            let _ = writeln!(
                o,
                "  {} {}  {}{}{}",
                c.network,
                c.address,
                c.state,
                c.holder
                    .as_deref()
                    .map_or(String::new(), |h| format!("  held by {h}")),
                c.note
                    .as_deref()
                    .map_or(String::new(), |n| format!("  ({n})"))
            );
        }
    }
    let _ = writeln!(o, "\nsaved plans on this node ({}):", ex.saved.len());
    for s in &ex.saved {
        let nets: Vec<String> = s
            .attachments
            .iter()
            .map(|(i, n)| format!("{i}={n}"))
            .collect();
        let _ = writeln!(
            o,
            "  sandbox {} {}  uid {}  {}{}",
            &s.container_id[..s.container_id.len().min(12)],
            s.ifname,
            s.pod_uid,
            nets.join(" "),
            if s.del_failures > 0 {
                format!("  DEL failed {}x", s.del_failures)
            } else {
                String::new()
            }
        );
    }
    match &ex.network_status {
        Some(v) => {
            let _ = writeln!(o, "\nnetwork-status (what ADD reported):");
            for n in v.as_array().into_iter().flatten() {
                let ips: Vec<&str> = n["ips"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|i| i.as_str())
                    .collect();
                let _ = writeln!(
                    o,
                    "  {:<8} {}  {}",
                    n["interface"].as_str().unwrap_or("?"),
                    n["name"].as_str().unwrap_or("?"),
                    ips.join(",")
                );
            }
        }
        None if ex.found => {
            let _ = writeln!(
                o,
                "\nnetwork-status: none (no ADD has completed for this pod)"
            );
        }
        None => {}
    }
    for n in &ex.notes {
        let _ = writeln!(o, "\nnote: {n}");
    }
    o
}
