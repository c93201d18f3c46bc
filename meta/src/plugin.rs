//! `plexus` as a CNI plugin: the skel's verbs wired to ADD, DEL, CHECK, STATUS and GC.

use crate::context::Ctx;
use crate::inputs::api::ApiInputs;
use crate::k8s::InClusterEnv;
use crate::verbs::{add, check as verbs, del};
use plexus_conf::error::CniError;
use plexus_delegates::logging::{self, LogOptions};
use plexus_delegates::skel::{AddOutput, CmdArgs, Plugin};
use std::path::PathBuf;

/// The plexus meta-plugin.
#[derive(Debug, Default)]
pub struct Plexus {
    /// The in-cluster API environment of this process, if any.
    pub in_cluster: Option<InClusterEnv>,
}

impl Plexus {
    fn ctx(&self, args: &CmdArgs) -> Result<Ctx, CniError> {
        let ctx = Ctx::new(args, self.in_cluster.clone())?;
        logging::init(&LogOptions {
            level: ctx.config.log_level.clone(),
            file: (!ctx.config.log_file.is_empty()).then(|| PathBuf::from(&ctx.config.log_file)),
            to_stderr: ctx.config.log_to_stderr,
            max_size_mb: ctx
                .config
                .log_options
                .as_ref()
                .and_then(|o| o.max_size)
                .map_or(100, u64::from),
            max_backups: ctx
                .config
                .log_options
                .as_ref()
                .and_then(|o| o.max_backups)
                .unwrap_or(5),
        });
        tracing::debug!(command = args.command.as_str(), container = %args.container_id, ifname = %args.ifname, "plexus called");
        Ok(ctx)
    }
}

impl Plugin for Plexus {
    fn add(&self, args: CmdArgs) -> Result<AddOutput, CniError> {
        let mut ctx = self.ctx(&args)?;
        let started = std::time::Instant::now();
        let out = add::add(&mut ctx, &mut ApiInputs, &args);
        tracing::info!(container = %args.container_id, ok = out.is_ok(), elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "ADD done");
        out
    }

    fn del(&self, args: CmdArgs) -> Result<(), CniError> {
        let mut ctx = self.ctx(&args)?;
        del::del(&mut ctx, &mut ApiInputs, &args)
    }

    fn check(&self, args: CmdArgs) -> Result<(), CniError> {
        let mut ctx = self.ctx(&args)?;
        verbs::check(&mut ctx, &args)
    }

    fn status(&self, args: CmdArgs) -> Result<(), CniError> {
        let mut ctx = self.ctx(&args)?;
        verbs::status(&mut ctx)
    }

    fn gc(&self, args: CmdArgs) -> Result<(), CniError> {
        let mut ctx = self.ctx(&args)?;
        verbs::gc(&mut ctx, &args)
    }
}
