//! Per-call context: the PF implementation, sysfs, state store, and where they come from.

use std::path::PathBuf;

use crate::netconf::NetConf;
use crate::pf::PfVfConfig;
use crate::sysfs::Sysfs;
use crate::vf_state::{StateStore, DEFAULT_STATE_DIR};

/// Settings from the process environment (read only by `main.rs`).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `PLEXUS_SYSFS_ROOT`.
    pub sysfs_root: Option<PathBuf>,
    /// `PLEXUS_SRIOV_STATE_DIR`.
    pub state_dir: Option<PathBuf>,
    /// `PLEXUS_SRIOV_FAKE_PF`: test-only seam, a JSON VF table file used instead of netlink.
    pub fake_pf: Option<PathBuf>,
}

impl Settings {
    /// Reads the settings through an environment lookup.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Settings {
        let path = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        Settings {
            sysfs_root: path("PLEXUS_SYSFS_ROOT"),
            state_dir: path("PLEXUS_SRIOV_STATE_DIR"),
            fake_pf: path("PLEXUS_SRIOV_FAKE_PF"),
        }
    }
}

/// What one call works with.
pub struct Ctx<'a> {
    /// PF-side VF configuration.
    pub pf: &'a dyn PfVfConfig,
    /// The sysfs tree.
    pub sysfs: Sysfs,
    /// The state directory.
    pub store: StateStore,
}

impl<'a> Ctx<'a> {
    /// Resolves sysfs root and state dir from the node's settings (environment), else the
    /// defaults. Never from the network config: whoever writes a NAD must not choose which
    /// directories a root plugin trusts or chmods (review finding C1).
    pub fn new(pf: &'a dyn PfVfConfig, settings: &Settings, _conf: Option<&NetConf>) -> Self {
        let sysfs_root = settings
            .sysfs_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/sys"));
        let state_dir = settings
            .state_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        Ctx {
            pf,
            sysfs: Sysfs::new(sysfs_root),
            store: StateStore::new(state_dir),
        }
    }
}
