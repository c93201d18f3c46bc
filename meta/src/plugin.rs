//! `plexus` as a CNI plugin: the skel's verbs wired to ADD, DEL, CHECK, STATUS and GC.

use crate::context::Ctx;
use crate::inputs::api::ApiInputs;
use crate::k8s::InClusterEnv;
use crate::verbs::{add, check as verbs, del};
use plexus_conf::error::CniError;
use plexus_delegates::logging::{self, LogOptions};
use plexus_delegates::skel::{AddOutput, CmdArgs, Plugin};
use plexus_delegates::timing;
use std::path::PathBuf;
use std::time::Instant;

/// The plexus meta-plugin.
#[derive(Debug, Default)]
pub struct Plexus {
    /// The in-cluster API environment of this process, if any.
    pub in_cluster: Option<InClusterEnv>,
    /// When the process started `main` (the calls' closing log lines count from it).
    pub started: Option<Instant>,
}

impl Plexus {
    fn ctx(&self, args: &CmdArgs) -> Result<Ctx, CniError> {
        timing::reset();
        let _phase = timing::phase("config");
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

/// The call's closing line: total time in this process and where it went (see
/// [`plexus_delegates::timing`]); `docs/performance.md` reads its breakdown from these lines.
fn log_done(verb: &str, args: &CmdArgs, ok: bool, started: Instant) {
    tracing::info!(container = %args.container_id, ifname = %args.ifname, ok,
        elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
        peak_rss_kib = timing::peak_rss_kib(),
        phases = ?timing::summary(), "{verb} done");
}

impl Plugin for Plexus {
    fn add(&self, args: CmdArgs) -> Result<AddOutput, CniError> {
        let started = self.started.unwrap_or_else(Instant::now);
        let mut ctx = self.ctx(&args)?;
        let out = add::add(&mut ctx, &mut ApiInputs, &args);
        log_done("ADD", &args, out.is_ok(), started);
        out.map_err(CniError::from)
    }

    fn del(&self, args: CmdArgs) -> Result<(), CniError> {
        let started = self.started.unwrap_or_else(Instant::now);
        let mut ctx = self.ctx(&args)?;
        let out = del::del(&mut ctx, &mut ApiInputs, &args);
        log_done("DEL", &args, out.is_ok(), started);
        out.map_err(CniError::from)
    }

    fn check(&self, args: CmdArgs) -> Result<(), CniError> {
        let mut ctx = self.ctx(&args)?;
        verbs::check(&mut ctx, &args).map_err(CniError::from)
    }

    fn status(&self, args: CmdArgs) -> Result<(), CniError> {
        let mut ctx = self.ctx(&args)?;
        verbs::status(&mut ctx).map_err(CniError::from)
    }

    fn gc(&self, args: CmdArgs) -> Result<(), CniError> {
        let mut ctx = self.ctx(&args)?;
        verbs::gc(&mut ctx, &args).map_err(CniError::from)
    }
}
