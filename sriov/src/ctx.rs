//! Per-call context: the PF implementation, sysfs, state store, and where they come from.

use std::path::PathBuf;

use crate::netconf::NetConf;
use crate::pf::PfVfConfig;
use crate::sysfs::Sysfs;
use crate::vf_state::{StateStore, DEFAULT_STATE_DIR};

/// The node's settings (read from the environment by the binary's `main`).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Root of the sysfs tree (`/sys`; `sriov list --sysfs-root`, or a fake tree in tests).
    pub sysfs_root: Option<PathBuf>,
    /// `PLEXUS_SRIOV_STATE_DIR`.
    pub state_dir: Option<PathBuf>,
    /// `PLEXUS_SRIOV_LOG_DIR`: the only directory a config's `logFile` may name a file in.
    pub log_dir: Option<PathBuf>,
    /// Test builds only: a JSON VF table file used instead of netlink.
    #[cfg(feature = "testkit")]
    pub fake_pf: Option<PathBuf>,
}

fn env_path(env: &impl Fn(&str) -> Option<String>, k: &str) -> Option<PathBuf> {
    env(k).filter(|v| !v.is_empty()).map(PathBuf::from)
}

impl Settings {
    /// The shipped binary's settings: only `PLEXUS_SRIOV_STATE_DIR` and `PLEXUS_SRIOV_LOG_DIR`.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Settings {
        Settings {
            state_dir: env_path(&env, "PLEXUS_SRIOV_STATE_DIR"),
            log_dir: env_path(&env, "PLEXUS_SRIOV_LOG_DIR"),
            ..Settings::default()
        }
    }

    /// Test builds: also a fake sysfs tree (`PLEXUS_SYSFS_ROOT`) and the file-backed PF
    /// (`PLEXUS_SRIOV_FAKE_PF`).
    #[cfg(feature = "testkit")]
    pub fn from_test_env(env: impl Fn(&str) -> Option<String>) -> Settings {
        Settings {
            sysfs_root: env_path(&env, "PLEXUS_SYSFS_ROOT"),
            state_dir: env_path(&env, "PLEXUS_SRIOV_STATE_DIR"),
            log_dir: env_path(&env, "PLEXUS_SRIOV_LOG_DIR"),
            fake_pf: env_path(&env, "PLEXUS_SRIOV_FAKE_PF"),
        }
    }
}

impl Settings {
    /// The directory a config's `logFile` must be in.
    pub fn log_dir(&self) -> PathBuf {
        self.log_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::logfile::DEFAULT_LOG_DIR))
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
