//! plexus-sriov: the `sriov` CNI delegate that attaches an SR-IOV VF to a pod, a drop-in for
//! sriov-cni (same NetConf keys), with state saved before any change, rollback on failure,
//! restore of the original netdev name after the pod netns vanished, CHECK, GC and `sriov list`.

pub mod add;
pub mod check;
pub mod cli;
pub mod ctx;
pub mod dad;
pub mod del;
pub mod devinfo;
pub mod error;
#[cfg(any(test, feature = "testkit"))]
pub mod fake_sysfs;
pub mod garp;
pub mod gc;
pub mod ipconf;
pub mod list;
pub mod logfile;
pub mod netconf;
pub mod nl;
pub mod owner;
pub mod pf;
#[cfg(any(test, feature = "testkit"))]
pub mod pf_fake;
pub mod pf_netlink;
pub mod restore;
pub mod sysfs;
pub mod vf_state;

use plexus_conf::error::CniError;
use plexus_delegates::skel::{AddOutput, CmdArgs, Plugin};

pub use ctx::{Ctx, Settings};
pub use error::SriovError;

use netconf::{NetConf, Purpose};
use pf::PfVfConfig;

/// The CNI plugin: builds the PF implementation per call from [`Settings`].
pub struct SriovPlugin {
    /// Settings from the environment.
    pub settings: Settings,
}

impl SriovPlugin {
    /// The PF implementation: netlink on the calling thread's netns (test builds: the
    /// file-backed fake when the settings name one).
    pub fn make_pf(settings: &Settings) -> Result<Box<dyn PfVfConfig>, SriovError> {
        #[cfg(feature = "testkit")]
        if let Some(p) = &settings.fake_pf {
            return Ok(Box::new(pf_fake::FilePf::new(p)));
        }
        let _ = settings;
        Ok(Box::new(pf_netlink::NetlinkPf::new(nl::Netlink::open()?)))
    }

    fn with<T>(
        &self,
        args: &CmdArgs,
        purpose: Purpose,
        f: impl FnOnce(&Ctx<'_>, &NetConf) -> Result<T, SriovError>,
    ) -> Result<T, CniError> {
        let conf = netconf::parse(&args.stdin, &args.args, purpose)?;
        let pf = Self::make_pf(&self.settings)?;
        let ctx = Ctx::new(pf.as_ref(), &self.settings, Some(&conf));
        Ok(f(&ctx, &conf)?)
    }
}

impl Plugin for SriovPlugin {
    fn add(&self, args: CmdArgs) -> Result<AddOutput, CniError> {
        self.with(&args, Purpose::Attach, |ctx, conf| {
            let result = add::add(ctx, &args, conf)?;
            Ok(AddOutput {
                result,
                cni_version: conf.cni_version.clone(),
            })
        })
    }

    fn del(&self, args: CmdArgs) -> Result<(), CniError> {
        self.with(&args, Purpose::Other, |ctx, conf| {
            del::del(ctx, &args, conf)
        })
    }

    fn check(&self, args: CmdArgs) -> Result<(), CniError> {
        self.with(&args, Purpose::Attach, |ctx, conf| {
            check::check(ctx, &args, conf)
        })
    }

    fn status(&self, args: CmdArgs) -> Result<(), CniError> {
        self.with(&args, Purpose::Other, |ctx, conf| {
            if let Some(t) = &conf.ipam_type {
                plexus_delegates::ipam::forward(
                    t,
                    plexus_delegates::skel::Command::Status,
                    &args,
                    &args.stdin,
                )
                .map_err(SriovError::Ipam)?;
            }
            let _ = ctx;
            Ok(())
        })
    }

    fn gc(&self, args: CmdArgs) -> Result<(), CniError> {
        self.with(&args, Purpose::Other, |ctx, conf| gc::gc(ctx, &args, conf))
    }
}

/// `sriov list ...`: returns the text to print.
pub fn list_main(argv: &[String], settings: &Settings) -> Result<String, String> {
    let o = list::parse_opts(argv)?;
    let mut s = settings.clone();
    s.sysfs_root = o.sysfs_root.or(s.sysfs_root);
    s.state_dir = o.state_dir.or(s.state_dir);
    let pf = SriovPlugin::make_pf(&s).map_err(|e| e.to_string())?;
    let ctx = Ctx::new(pf.as_ref(), &s, None);
    let rows = list::collect(&ctx).map_err(|e| e.to_string())?;
    if o.json {
        serde_json::to_string_pretty(&rows)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    } else {
        Ok(list::table(&rows))
    }
}
