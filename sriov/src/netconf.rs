//! Parsing and validation of the sriov network configuration (sriov-cni compatible keys).
//!
//! Pure functions over bytes: no file, sysfs or environment access.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::SriovError;
use crate::pf::{LinkState, MacAddr, VlanProto};

/// Standard CNI keys accepted at the top level besides the sriov ones.
const STANDARD_KEYS: &[&str] = &[
    "cniVersion",
    "cniVersions",
    "name",
    "type",
    "capabilities",
    "runtimeConfig",
    "args",
    "ipam",
    "dns",
    "prevResult",
    // Multus injects the PCI address twice: as deviceID and as pciBusID.
    "pciBusID",
];

/// sriov-cni keys plus the plexus addition `mtu`. Node paths (sysfs root, state dir) are never
/// network-config keys: they come from the environment only.
const SRIOV_KEYS: &[&str] = &[
    "deviceID",
    "vlan",
    "vlanQoS",
    "vlanProto",
    "mac",
    "spoofchk",
    "trust",
    "link_state",
    "min_tx_rate",
    "max_tx_rate",
    "logLevel",
    "logFile",
    "mtu",
    // sriov-cni fields without a JSON tag, which Go matches by field name: the PF name (found
    // through sysfs here) and the VF index (the deviceID decides). Accepted and ignored.
    "master",
    "VFID",
];

/// Keys sriov-cni defines (or defined, so old NADs and its own test configs carry them) that
/// plexus' sriov accepts and ignores: `vf` (its unit-test configs), the internal state fields
/// Go would decode from stdin (`OrigVfState`, `ContIFNames`, `HostIFNames`, `DPDKMode`), and
/// fields removed upstream (`dpdk`, `cniDir`, `l2enable`, `sharedvf`, `if0name`,
/// `vlan_trunk`). Only their presence is allowed; their values are never read.
const IGNORED_SRIOV_CNI_KEYS: &[&str] = &[
    "vf",
    "OrigVfState",
    "ContIFNames",
    "HostIFNames",
    "DPDKMode",
    "dpdk",
    "cniDir",
    "l2enable",
    "sharedvf",
    "if0name",
    "vlan_trunk",
];

/// VLAN settings for the VF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VlanSpec {
    /// VLAN id, 0–4094 (0 = untagged).
    pub id: u16,
    /// QoS / PCP, 0–7.
    pub qos: u8,
    /// Protocol.
    pub proto: VlanProto,
}

/// TX rate limits in Mbps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateSpec {
    /// Minimum (0 = none).
    pub min: u32,
    /// Maximum (0 = unlimited).
    pub max: u32,
}

/// A validated sriov network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    /// `cniVersion`.
    pub cni_version: String,
    /// `name`.
    pub name: String,
    /// `deviceID`: the VF's PCI address (None only where allowed: DEL, GC, STATUS).
    pub device_id: Option<String>,
    /// `vlan` / `vlanQoS` / `vlanProto`; None = leave the VLAN alone.
    pub vlan: Option<VlanSpec>,
    /// Requested MAC after precedence: runtimeConfig.mac > CNI_ARGS MAC > `mac`.
    pub mac: Option<MacAddr>,
    /// `spoofchk`.
    pub spoofchk: Option<bool>,
    /// `trust`.
    pub trust: Option<bool>,
    /// `link_state`.
    pub link_state: Option<LinkState>,
    /// `min_tx_rate` / `max_tx_rate` (unset one = 0, as sriov-cni).
    pub rate: Option<RateSpec>,
    /// `runtimeConfig.CNIDeviceInfoFile`: the NPWG device-info file to write after ADD.
    pub device_info_file: Option<PathBuf>,
    /// `mtu` (plexus addition): the VF netdev MTU inside the pod.
    pub mtu: Option<u32>,
    /// `ipam.type`, when IPAM is configured.
    pub ipam_type: Option<String>,
    /// `logLevel`.
    pub log_level: Option<String>,
    /// `logFile`.
    pub log_file: Option<PathBuf>,
    /// `cni.dev/valid-attachments` (GC): (containerID, ifname) pairs.
    pub valid_attachments: Option<Vec<(String, String)>>,
}

/// Which command the config is parsed for (deviceID is required only for ADD and CHECK).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// ADD / CHECK: deviceID required.
    Attach,
    /// DEL / GC / STATUS: deviceID optional (DEL takes it from the state file).
    Other,
}

fn err(msg: impl Into<String>) -> SriovError {
    SriovError::Config(msg.into())
}

fn squash(s: &str) -> String {
    s.chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Maps an input key to its canonical spelling. Go's encoding/json (sriov-cni) matches keys
/// case-insensitively, so `deviceId` keeps working; anything else is an error that names the
/// key and, when it only differs by case, `-` or `_`, suggests the known one.
fn canonical_key(key: &str) -> Result<Option<&'static str>, SriovError> {
    if key.starts_with("cni.dev/") {
        return Ok(None);
    }
    if IGNORED_SRIOV_CNI_KEYS
        .iter()
        .any(|k| k.eq_ignore_ascii_case(key))
    {
        tracing::debug!(key, "sriov-cni key accepted and ignored");
        return Ok(None);
    }
    for k in STANDARD_KEYS.iter().chain(SRIOV_KEYS) {
        if k.eq_ignore_ascii_case(key) {
            return Ok(Some(k));
        }
    }
    let near = STANDARD_KEYS
        .iter()
        .chain(SRIOV_KEYS)
        .find(|k| squash(k) == squash(key));
    Err(match near {
        Some(k) => err(format!("unknown key {key:?} (did you mean {k:?}?)")),
        None => err(format!("unknown key {key:?}")),
    })
}

fn get_str(v: &Value, key: &str) -> Result<String, SriovError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| err(format!("{key} must be a string, got {v}")))
}

fn get_int(v: &Value, key: &str, min: i64, max: i64) -> Result<i64, SriovError> {
    let n = v
        .as_i64()
        .ok_or_else(|| err(format!("{key} must be an integer, got {v}")))?;
    if n < min || n > max {
        return Err(err(format!(
            "{key} {n} invalid: value must be in the range {min}-{max}"
        )));
    }
    Ok(n)
}

fn on_off(v: &Value, key: &str) -> Result<Option<bool>, SriovError> {
    // sriov-cni treats any non-empty value other than "on" as off; we reject typos instead.
    match get_str(v, key)?.as_str() {
        "" => Ok(None),
        "on" => Ok(Some(true)),
        "off" => Ok(Some(false)),
        other => Err(err(format!(
            "{key} {other:?} invalid: must be \"on\" or \"off\""
        ))),
    }
}

/// Validates a PCI address `dddd:bb:dd.f` (domain optional, as accepted by sysfs lookups).
pub fn validate_pci_address(s: &str) -> Result<(), SriovError> {
    let bad = || {
        err(format!(
            "deviceID {s:?} is not a PCI address (want dddd:bb:dd.f)"
        ))
    };
    let (head, func) = s.rsplit_once('.').ok_or_else(bad)?;
    let parts: Vec<&str> = head.split(':').collect();
    let hex = |p: &str, n: usize| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit());
    let ok = match parts.as_slice() {
        // Domains can be wider than 4 digits (e.g. VMD and some hypervisors: 10000:00:02.0).
        [d, b, dev] => d.len() >= 4 && hex(d, d.len()) && hex(b, 2) && hex(dev, 2),
        _ => false,
    } && func.len() == 1
        && func.chars().all(|c| c.is_digit(8));
    if ok {
        Ok(())
    } else {
        Err(bad())
    }
}

/// Extracts `MAC=` from CNI_ARGS with sriov-cni's rules: keys other than `IgnoreUnknown`,
/// `MAC` and the `K8S_POD_*` family are an error unless `IgnoreUnknown` is `1`/`true`.
pub fn mac_from_cni_args(args: &str) -> Result<Option<MacAddr>, SriovError> {
    let mut mac = None;
    let mut unknown = Vec::new();
    let mut ignore_unknown = false;
    for pair in args.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| SriovError::Args(format!("{pair:?} is not KEY=VALUE")))?;
        match k {
            "IgnoreUnknown" => {
                ignore_unknown = matches!(v.to_ascii_lowercase().as_str(), "1" | "true")
            }
            "MAC" => {
                mac = Some(
                    v.parse::<MacAddr>()
                        .map_err(|e| SriovError::Args(format!("MAC: {e}")))?,
                )
            }
            "K8S_POD_NAMESPACE" | "K8S_POD_NAME" | "K8S_POD_INFRA_CONTAINER_ID" | "K8S_POD_UID" => {
            }
            other => unknown.push(other.to_string()),
        }
    }
    if !unknown.is_empty() && !ignore_unknown {
        return Err(SriovError::Args(format!(
            "unknown keys {unknown:?} (set IgnoreUnknown=1 to allow)"
        )));
    }
    Ok(mac)
}

fn parse_mac(v: &Value, key: &str) -> Result<Option<MacAddr>, SriovError> {
    let s = get_str(v, key)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|e: String| err(format!("{key}: {e}")))
}

/// Parses and validates the network configuration `stdin` with CNI_ARGS `cni_args`.
pub fn parse(stdin: &[u8], cni_args: &str, purpose: Purpose) -> Result<NetConf, SriovError> {
    let root: Value =
        serde_json::from_slice(stdin).map_err(|e| err(format!("not valid JSON: {e}")))?;
    let obj = root
        .as_object()
        .ok_or_else(|| err("config must be a JSON object"))?;
    let mut m: Map<String, Value> = Map::new();
    let mut valid_attachments = None;
    for (k, v) in obj {
        match canonical_key(k)? {
            Some(c) if m.contains_key(c) => {
                return Err(err(format!(
                    "key {c:?} given twice (keys are case-insensitive)"
                )));
            }
            Some(c) => {
                m.insert(c.to_string(), v.clone());
            }
            None if k == "cni.dev/valid-attachments" => {
                valid_attachments = Some(parse_attachments(v)?);
            }
            None => {}
        }
    }
    let has = |k: &str| m.get(k).filter(|v| !v.is_null());

    let cni_version = match has("cniVersion") {
        Some(v) => get_str(v, "cniVersion")?,
        None => "0.1.0".to_string(),
    };
    let name = has("name")
        .map(|v| get_str(v, "name"))
        .transpose()?
        .unwrap_or_default();

    // The NAD's own deviceID wins; runtimeConfig.deviceID (a pod's or device plugin's choice)
    // only reaches the plugin when the NAD declares the `deviceID` capability.
    let rc_device = has("runtimeConfig")
        .and_then(|rc| rc.get("deviceID"))
        .filter(|v| !v.is_null());
    let device_id = match has("deviceID").or(rc_device) {
        Some(v) => {
            let s = get_str(v, "deviceID")?;
            validate_pci_address(&s)?;
            Some(s)
        }
        None => None,
    };
    if device_id.is_none() && purpose == Purpose::Attach {
        return Err(err("deviceID (VF PCI address) is required"));
    }

    let vlan_id = has("vlan")
        .map(|v| get_int(v, "vlan", 0, 4094))
        .transpose()?;
    let qos = has("vlanQoS")
        .map(|v| get_int(v, "vlanQoS", 0, 7))
        .transpose()?;
    let proto = match has("vlanProto") {
        Some(v) => match get_str(v, "vlanProto")?.to_ascii_lowercase().as_str() {
            "802.1q" => Some(VlanProto::Dot1Q),
            "802.1ad" => Some(VlanProto::Dot1Ad),
            other => {
                return Err(err(format!(
                    "vlanProto {other:?} invalid: must be \"802.1q\" or \"802.1ad\""
                )))
            }
        },
        None => None,
    };
    let vlan = match vlan_id {
        None => {
            if qos.is_some() {
                return Err(err("vlanQoS requires vlan"));
            }
            if proto.is_some() {
                return Err(err("vlanProto requires vlan"));
            }
            None
        }
        Some(id) => {
            let qos = qos.unwrap_or(0);
            let proto = proto.unwrap_or_default();
            if id == 0 && qos != 0 {
                return Err(err("non-zero vlanQoS requires a non-zero vlan"));
            }
            if id == 0 && proto == VlanProto::Dot1Ad {
                return Err(err("vlanProto 802.1ad requires a non-zero vlan"));
            }
            Some(VlanSpec {
                id: id as u16,
                qos: qos as u8,
                proto,
            })
        }
    };

    let cfg_mac = has("mac")
        .map(|v| parse_mac(v, "mac"))
        .transpose()?
        .flatten();
    let args_mac = mac_from_cni_args(cni_args)?;
    let rc = has("runtimeConfig");
    if let Some(rc) = rc {
        if !rc.is_object() {
            return Err(err("runtimeConfig must be an object"));
        }
    }
    let rc_mac = rc
        .and_then(|r| r.get("mac"))
        .filter(|v| !v.is_null())
        .map(|v| parse_mac(v, "runtimeConfig.mac"))
        .transpose()?
        .flatten();
    if let Some(ips) = rc.and_then(|r| r.get("ips")).filter(|v| !v.is_null()) {
        // The IPs reach IPAM through the unchanged stdin; only check their shape here.
        let list = ips
            .as_array()
            .ok_or_else(|| err("runtimeConfig.ips must be a list of strings"))?;
        if list.iter().any(|i| !i.is_string()) {
            return Err(err("runtimeConfig.ips must be a list of strings"));
        }
    }
    let mac = rc_mac.or(args_mac).or(cfg_mac);
    let device_info_file = match rc.and_then(|r| r.get("CNIDeviceInfoFile")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if Path::new(s).is_absolute() => Some(PathBuf::from(s)),
        Some(other) => {
            return Err(err(format!(
                "runtimeConfig.CNIDeviceInfoFile must be an absolute path, got {other}"
            )))
        }
    };

    let spoofchk = has("spoofchk")
        .map(|v| on_off(v, "spoofchk"))
        .transpose()?
        .flatten();
    let trust = has("trust")
        .map(|v| on_off(v, "trust"))
        .transpose()?
        .flatten();
    let link_state = match has("link_state") {
        Some(v) => match get_str(v, "link_state")?.as_str() {
            "" => None,
            "auto" => Some(LinkState::Auto),
            "enable" => Some(LinkState::Enable),
            "disable" => Some(LinkState::Disable),
            other => {
                return Err(err(format!(
                    "link_state {other:?} invalid: must be auto, enable or disable"
                )))
            }
        },
        None => None,
    };
    let min = has("min_tx_rate")
        .map(|v| get_int(v, "min_tx_rate", 0, u32::MAX as i64))
        .transpose()?;
    let max = has("max_tx_rate")
        .map(|v| get_int(v, "max_tx_rate", 0, u32::MAX as i64))
        .transpose()?;
    let rate = match (min, max) {
        (None, None) => None,
        (min, max) => {
            let (min, max) = (min.unwrap_or(0) as u32, max.unwrap_or(0) as u32);
            // Kernel rule (rtnl_set_vf_rate): max 0 means unlimited, otherwise min <= max.
            if max != 0 && min > max {
                return Err(err(format!(
                    "min_tx_rate {min} is greater than max_tx_rate {max}"
                )));
            }
            Some(RateSpec { min, max })
        }
    };
    // 0 means "leave the MTU alone", as for an absent key.
    let mtu = match has("mtu") {
        Some(v) if v.as_u64() == Some(0) => None,
        Some(v) => Some(get_int(v, "mtu", 68, 65535)? as u32),
        None => None,
    };

    let ipam_type = match has("ipam") {
        Some(Value::Object(ipam)) => match ipam.get("type") {
            Some(Value::String(t)) if !t.is_empty() => Some(t.clone()),
            Some(Value::String(_)) | None => None,
            Some(other) => return Err(err(format!("ipam.type must be a string, got {other}"))),
        },
        Some(other) => return Err(err(format!("ipam must be an object, got {other}"))),
        None => None,
    };
    let log_level = has("logLevel")
        .map(|v| get_str(v, "logLevel"))
        .transpose()?;
    // Like sriov-cni, an unknown log level is not a network error: it falls back to info.
    let log_level = log_level.map(|l| {
        let ok = matches!(
            l.to_ascii_lowercase().as_str(),
            "" | "panic" | "error" | "warning" | "warn" | "info" | "verbose" | "debug" | "trace"
        );
        if ok {
            l
        } else {
            tracing::warn!(level = %l, "unknown logLevel, using info");
            "info".to_string()
        }
    });
    let path_of = |k: &str| -> Result<Option<PathBuf>, SriovError> {
        Ok(has(k)
            .map(|v| get_str(v, k))
            .transpose()?
            .filter(|s| !s.is_empty())
            .map(PathBuf::from))
    };

    Ok(NetConf {
        cni_version,
        name,
        device_id,
        vlan,
        mac,
        spoofchk,
        trust,
        link_state,
        rate,
        device_info_file,
        mtu,
        ipam_type,
        log_level,
        log_file: path_of("logFile")?,
        valid_attachments,
    })
}

fn parse_attachments(v: &Value) -> Result<Vec<(String, String)>, SriovError> {
    let bad = || err("cni.dev/valid-attachments must be a list of {containerID, ifname}");
    v.as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|a| {
            let c = a
                .get("containerID")
                .and_then(Value::as_str)
                .ok_or_else(bad)?;
            let i = a.get("ifname").and_then(Value::as_str).ok_or_else(bad)?;
            Ok((c.to_string(), i.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests;
