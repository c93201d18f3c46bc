//! Test doubles for [`PfVfConfig`]: an in-memory recording double and a JSON-file-backed one.
//!
//! [`FilePf`] is the test-only seam behind `PLEXUS_SRIOV_FAKE_PF=<file>`: the VF table lives in
//! a JSON file, so the real `sriov` binary can be driven end to end across process runs.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::pf::{LinkState, MacAddr, PfError, PfVfConfig, VfConfig, VlanProto};

mod driver;
pub use driver::{FakeDriver, IGB_LINK_MBPS};

/// One recorded PF-side call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Call {
    /// `get_vf`.
    GetVf {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
    },
    /// `set_vf_vlan`.
    SetVfVlan {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// VLAN id.
        vlan: u16,
        /// QoS.
        qos: u8,
        /// Protocol.
        proto: VlanProto,
    },
    /// `set_vf_mac`.
    SetVfMac {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// MAC.
        mac: MacAddr,
    },
    /// `set_vf_spoofchk`.
    SetVfSpoofchk {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// Setting.
        on: bool,
    },
    /// `set_vf_trust`.
    SetVfTrust {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// Setting.
        on: bool,
    },
    /// `set_vf_rate`.
    SetVfRate {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// Min rate.
        min: u32,
        /// Max rate.
        max: u32,
    },
    /// `set_vf_link_state`.
    SetVfLinkState {
        /// PF.
        pf: String,
        /// VF index.
        vf: u32,
        /// State.
        state: LinkState,
    },
}

impl Call {
    /// The operation name (`get_vf`, `set_vf_vlan`, ...).
    pub fn op(&self) -> &'static str {
        match self {
            Call::GetVf { .. } => "get_vf",
            Call::SetVfVlan { .. } => "set_vf_vlan",
            Call::SetVfMac { .. } => "set_vf_mac",
            Call::SetVfSpoofchk { .. } => "set_vf_spoofchk",
            Call::SetVfTrust { .. } => "set_vf_trust",
            Call::SetVfRate { .. } => "set_vf_rate",
            Call::SetVfLinkState { .. } => "set_vf_link_state",
        }
    }

    fn target(&self) -> (&str, u32) {
        match self {
            Call::GetVf { pf, vf }
            | Call::SetVfVlan { pf, vf, .. }
            | Call::SetVfMac { pf, vf, .. }
            | Call::SetVfSpoofchk { pf, vf, .. }
            | Call::SetVfTrust { pf, vf, .. }
            | Call::SetVfRate { pf, vf, .. }
            | Call::SetVfLinkState { pf, vf, .. } => (pf, *vf),
        }
    }
}

/// The state shared by both doubles: a VF table per PF plus the call log and failure injection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FakePfState {
    /// VF tables keyed by PF netdev name; index = VF index.
    pub pfs: BTreeMap<String, Vec<VfConfig>>,
    /// Every call made, in order.
    #[serde(default)]
    pub calls: Vec<Call>,
    /// Fail the call whose 1-based number (counting every call, `get_vf` included) is this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_call: Option<usize>,
    /// Fail the next call of this operation (e.g. `"set_vf_trust"`) once, then clear it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_at: Option<String>,
    /// The PF driver whose refusals are mirrored (`"generic"` or `"igb"`).
    #[serde(default, skip_serializing_if = "is_generic")]
    pub driver: FakeDriver,
    /// The PF has no link (the `igb` model then refuses every rate change).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_carrier: bool,
}

fn is_generic(d: &FakeDriver) -> bool {
    *d == FakeDriver::Generic
}

impl FakePfState {
    /// A state with one PF holding `n` VFs in the default configuration (spoofchk on).
    pub fn with_pf(pf: &str, n: usize) -> Self {
        let vf = VfConfig {
            spoofchk: true,
            ..VfConfig::default()
        };
        let mut pfs = BTreeMap::new();
        pfs.insert(pf.to_string(), vec![vf; n]);
        FakePfState {
            pfs,
            ..Default::default()
        }
    }

    /// Applies one call: records it, injects failures, then reads or mutates the table.
    pub fn apply(&mut self, call: Call) -> Result<Option<VfConfig>, PfError> {
        self.calls.push(call.clone());
        let (pf, vf) = call.target();
        let (pf, vf) = (pf.to_string(), vf);
        let op = call.op();
        if self.fail_call == Some(self.calls.len()) {
            return Err(PfError::Failed {
                op,
                pf,
                vf,
                cause: format!("injected failure at call {}", self.calls.len()),
            });
        }
        if self.fail_at.as_deref() == Some(op) {
            self.fail_at = None;
            return Err(PfError::Failed {
                op,
                pf,
                vf,
                cause: "injected failure (failAt)".into(),
            });
        }
        let table = self
            .pfs
            .get_mut(&pf)
            .ok_or_else(|| PfError::PfNotFound { pf: pf.clone() })?;
        let entry = table
            .get_mut(vf as usize)
            .ok_or_else(|| PfError::VfNotFound { pf: pf.clone(), vf })?;
        if let Some(cause) = self.driver.refusal(&call, !self.no_carrier) {
            return Err(PfError::Failed {
                op,
                pf,
                vf,
                cause: cause.into(),
            });
        }
        match call {
            Call::GetVf { .. } => return Ok(Some(entry.clone())),
            Call::SetVfVlan {
                vlan, qos, proto, ..
            } => {
                // Mirror the kernel/driver checks (netdevsim: vlan > 4095 or qos > 7 -> EINVAL).
                if vlan > 4095 || qos > 7 {
                    return Err(PfError::Failed {
                        op,
                        pf,
                        vf,
                        cause: "Invalid argument (os error 22)".into(),
                    });
                }
                entry.vlan = vlan;
                entry.qos = qos;
                entry.proto = proto;
            }
            Call::SetVfMac { mac, .. } => entry.mac = mac,
            Call::SetVfSpoofchk { on, .. } => entry.spoofchk = on,
            Call::SetVfTrust { on, .. } => entry.trust = on,
            Call::SetVfRate { min, max, .. } => {
                // rtnl_set_vf_rate: max != 0 && max < min -> EINVAL.
                if max != 0 && max < min {
                    return Err(PfError::Failed {
                        op,
                        pf,
                        vf,
                        cause: "Invalid argument (os error 22)".into(),
                    });
                }
                entry.min_tx_rate = min;
                entry.max_tx_rate = max;
            }
            Call::SetVfLinkState { state, .. } => entry.link_state = state,
        }
        Ok(None)
    }
}

fn call_get(pf: &str, vf: u32) -> Call {
    Call::GetVf { pf: pf.into(), vf }
}

/// Implements [`PfVfConfig`] in terms of a closure that applies one [`Call`].
macro_rules! impl_pf_via_apply {
    ($ty:ty) => {
        impl PfVfConfig for $ty {
            fn get_vf(&self, pf: &str, vf: u32) -> Result<VfConfig, PfError> {
                self.apply(call_get(pf, vf))?
                    .ok_or_else(|| PfError::VfNotFound { pf: pf.into(), vf })
            }
            fn set_vf_vlan(
                &self,
                pf: &str,
                vf: u32,
                vlan: u16,
                qos: u8,
                proto: VlanProto,
            ) -> Result<(), PfError> {
                self.apply(Call::SetVfVlan {
                    pf: pf.into(),
                    vf,
                    vlan,
                    qos,
                    proto,
                })
                .map(drop)
            }
            fn set_vf_mac(&self, pf: &str, vf: u32, mac: MacAddr) -> Result<(), PfError> {
                self.apply(Call::SetVfMac {
                    pf: pf.into(),
                    vf,
                    mac,
                })
                .map(drop)
            }
            fn set_vf_spoofchk(&self, pf: &str, vf: u32, on: bool) -> Result<(), PfError> {
                self.apply(Call::SetVfSpoofchk {
                    pf: pf.into(),
                    vf,
                    on,
                })
                .map(drop)
            }
            fn set_vf_trust(&self, pf: &str, vf: u32, on: bool) -> Result<(), PfError> {
                self.apply(Call::SetVfTrust {
                    pf: pf.into(),
                    vf,
                    on,
                })
                .map(drop)
            }
            fn set_vf_rate(&self, pf: &str, vf: u32, min: u32, max: u32) -> Result<(), PfError> {
                self.apply(Call::SetVfRate {
                    pf: pf.into(),
                    vf,
                    min,
                    max,
                })
                .map(drop)
            }
            fn set_vf_link_state(
                &self,
                pf: &str,
                vf: u32,
                state: LinkState,
            ) -> Result<(), PfError> {
                self.apply(Call::SetVfLinkState {
                    pf: pf.into(),
                    vf,
                    state,
                })
                .map(drop)
            }
        }
    };
}

/// In-memory recording double: a VF table, a typed call log, and "fail the Nth call".
#[derive(Debug, Default)]
pub struct RecordingPf {
    state: Mutex<FakePfState>,
}

impl RecordingPf {
    /// A double with the given initial state.
    pub fn new(state: FakePfState) -> Self {
        RecordingPf {
            state: Mutex::new(state),
        }
    }

    /// Makes the `n`th call from now (1-based, counting every call) fail; `None` disables it.
    pub fn fail_nth_call(&self, n: Option<usize>) {
        let mut s = self.lock();
        let base = s.calls.len();
        s.fail_call = n.map(|n| base + n);
    }

    /// A snapshot of the state (VF tables and calls).
    pub fn snapshot(&self) -> FakePfState {
        self.lock().clone()
    }

    /// The recorded calls.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakePfState> {
        // A panic while holding the lock only happens in a failing test; keep going with the data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn apply(&self, call: Call) -> Result<Option<VfConfig>, PfError> {
        self.lock().apply(call)
    }
}

impl_pf_via_apply!(RecordingPf);

/// File-backed double: the [`FakePfState`] is loaded from and saved to a JSON file on every
/// call, under an exclusive `flock` on the file, so separate processes share one VF table.
#[derive(Debug, Clone)]
pub struct FilePf {
    path: PathBuf,
}

impl FilePf {
    /// Uses the state file at `path` (it must exist; see [`FilePf::create`]).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FilePf { path: path.into() }
    }

    /// Writes an initial state file.
    pub fn create(path: &Path, state: &FakePfState) -> std::io::Result<Self> {
        let bytes = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
        std::fs::write(path, bytes)?;
        Ok(FilePf::new(path))
    }

    /// Reads the current state file.
    pub fn load(&self) -> std::io::Result<FakePfState> {
        let bytes = std::fs::read(&self.path)?;
        serde_json::from_slice(&bytes).map_err(std::io::Error::other)
    }

    fn apply(&self, call: Call) -> Result<Option<VfConfig>, PfError> {
        let (pf, vf) = {
            let (p, v) = call.target();
            (p.to_string(), v)
        };
        let op = call.op();
        let fail = |cause: String| PfError::Failed {
            op,
            pf: pf.clone(),
            vf,
            cause: format!("fake PF file {}: {cause}", self.path.display()),
        };
        let file = File::options()
            .read(true)
            .write(true)
            .open(&self.path)
            .map_err(|e| fail(e.to_string()))?;
        file.lock().map_err(|e| fail(e.to_string()))?;
        let mut state = self.load().map_err(|e| fail(e.to_string()))?;
        let out = state.apply(call);
        let bytes = serde_json::to_vec_pretty(&state).map_err(|e| fail(e.to_string()))?;
        // Rewrite in place while holding the lock (a rename would escape the flock).
        std::fs::write(&self.path, bytes).map_err(|e| fail(e.to_string()))?;
        drop(file);
        out
    }
}

impl_pf_via_apply!(FilePf);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_double_records_and_fails_nth_call() {
        let pf = RecordingPf::new(FakePfState::with_pf("pf0", 2));
        pf.set_vf_vlan("pf0", 1, 100, 3, VlanProto::Dot1Ad).unwrap();
        pf.fail_nth_call(Some(2));
        pf.set_vf_trust("pf0", 1, true).unwrap();
        let err = pf.set_vf_trust("pf0", 1, false).unwrap_err();
        assert!(err.to_string().contains("injected"), "{err}");
        let vf = pf.get_vf("pf0", 1).unwrap();
        assert_eq!(
            (vf.vlan, vf.qos, vf.proto, vf.trust),
            (100, 3, VlanProto::Dot1Ad, true)
        );
        assert_eq!(pf.calls().len(), 4);
        assert!(matches!(
            pf.get_vf("pf0", 2),
            Err(PfError::VfNotFound { .. })
        ));
        assert!(matches!(
            pf.get_vf("nope", 0),
            Err(PfError::PfNotFound { .. })
        ));
        assert!(pf.set_vf_rate("pf0", 0, 10, 5).is_err());
    }

    #[test]
    fn file_double_persists_between_instances_and_fail_at_is_one_shot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pf.json");
        let mut st = FakePfState::with_pf("pf0", 1);
        st.fail_at = Some("set_vf_mac".into());
        FilePf::create(&path, &st).unwrap();
        let mac: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        assert!(FilePf::new(&path).set_vf_mac("pf0", 0, mac).is_err());
        FilePf::new(&path).set_vf_mac("pf0", 0, mac).unwrap();
        assert_eq!(FilePf::new(&path).get_vf("pf0", 0).unwrap().mac, mac);
        let st = FilePf::new(&path).load().unwrap();
        assert_eq!(st.calls.len(), 3);
        assert_eq!(st.fail_at, None);
    }
}
