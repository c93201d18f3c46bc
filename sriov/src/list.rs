//! `sriov list`: PFs, VFs, driver, netdev, PF-side settings and holder, as a table or JSON.

use serde::Serialize;

use crate::ctx::Ctx;
use crate::error::SriovError;
use crate::pf::VfConfig;

/// One VF row.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VfRow {
    /// PF netdev (or PCI address when it has none).
    pub pf: String,
    /// PF PCI address.
    pub pf_pci: String,
    /// VF index.
    pub vf: u32,
    /// VF PCI address.
    pub pci: String,
    /// Bound driver.
    pub driver: Option<String>,
    /// Netdev names visible in this netns.
    pub netdevs: Vec<String>,
    /// PF-side configuration (None when it could not be read; see `error`).
    pub config: Option<VfConfig>,
    /// Holder: container id.
    pub container_id: Option<String>,
    /// Holder: interface name.
    pub ifname: Option<String>,
    /// Holder: netns.
    pub netns: Option<String>,
    /// Why `config` is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Collects every VF of every PF.
pub fn collect(ctx: &Ctx<'_>) -> Result<Vec<VfRow>, SriovError> {
    let mut rows = Vec::new();
    for pf in ctx.sysfs.list_pfs()? {
        let pf_name = pf.pf_netdev.clone().unwrap_or_else(|| pf.pf_pci.clone());
        for (idx, pci) in pf.vfs {
            let loc = ctx.sysfs.find_vf(&pci).ok();
            let (config, error) = match &pf.pf_netdev {
                Some(n) => match ctx.pf.get_vf(n, idx) {
                    Ok(c) => (Some(c), None),
                    Err(e) => (None, Some(e.to_string())),
                },
                None => (None, Some("PF has no netdev".into())),
            };
            let holder = ctx.store.allocation(&pci).ok().flatten();
            rows.push(VfRow {
                pf: pf_name.clone(),
                pf_pci: pf.pf_pci.clone(),
                vf: idx,
                driver: loc.as_ref().and_then(|l| l.driver.clone()),
                netdevs: loc.map(|l| l.netdevs).unwrap_or_default(),
                pci,
                config,
                container_id: holder.as_ref().map(|h| h.container_id.clone()),
                ifname: holder.as_ref().map(|h| h.ifname.clone()),
                netns: holder.map(|h| h.netns),
                error,
            });
        }
    }
    Ok(rows)
}

/// Renders rows as an aligned text table.
pub fn table(rows: &[VfRow]) -> String {
    let head = [
        "PF",
        "VF",
        "PCI",
        "DRIVER",
        "NETDEV",
        "MAC",
        "VLAN",
        "QOS",
        "PROTO",
        "SPOOFCHK",
        "TRUST",
        "RATE",
        "LINK",
        "CONTAINER",
        "IFNAME",
    ];
    let onoff = |b: bool| if b { "on" } else { "off" }.to_string();
    let mut cells: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let c = r.config.as_ref();
        let f = |g: &dyn Fn(&VfConfig) -> String| c.map(g).unwrap_or_else(|| "?".into());
        cells.push(vec![
            r.pf.clone(),
            r.vf.to_string(),
            r.pci.clone(),
            r.driver.clone().unwrap_or_else(|| "-".into()),
            if r.netdevs.is_empty() {
                "-".into()
            } else {
                r.netdevs.join(",")
            },
            f(&|c| c.mac.to_string()),
            f(&|c| c.vlan.to_string()),
            f(&|c| c.qos.to_string()),
            f(&|c| c.proto.to_string()),
            f(&|c| onoff(c.spoofchk)),
            f(&|c| onoff(c.trust)),
            f(&|c| format!("{}-{}", c.min_tx_rate, c.max_tx_rate)),
            f(&|c| c.link_state.to_string()),
            r.container_id.clone().unwrap_or_else(|| "-".into()),
            r.ifname.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|i| cells.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Options of `sriov list`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListOpts {
    /// `--json`.
    pub json: bool,
    /// `--sysfs-root DIR`.
    pub sysfs_root: Option<std::path::PathBuf>,
    /// `--state-dir DIR`.
    pub state_dir: Option<std::path::PathBuf>,
}

/// Parses the arguments after `list`.
pub fn parse_opts(argv: &[String]) -> Result<ListOpts, String> {
    let mut o = ListOpts::default();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => o.json = true,
            "--sysfs-root" => o.sysfs_root = it.next().map(Into::into),
            "--state-dir" => o.state_dir = it.next().map(Into::into),
            "-h" | "--help" => {
                return Err(
                    "usage: sriov list [--json] [--sysfs-root DIR] [--state-dir DIR]".into(),
                )
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    Ok(o)
}
