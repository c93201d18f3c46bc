//! `plexus` as a CNI plugin: the skel's verbs wired to ADD, DEL, CHECK, STATUS and GC.

use crate::context::Ctx;
use crate::inputs::api::ApiInputs;
use crate::k8s::InClusterEnv;
use crate::outcome;
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
        let format = logging::Format::parse(&ctx.config.log_format);
        logging::init_with_format(
            &LogOptions {
                level: ctx.config.log_level.clone(),
                file: (!ctx.config.log_file.is_empty())
                    .then(|| PathBuf::from(&ctx.config.log_file)),
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
            },
            format.unwrap_or_default(),
        );
        if format.is_none() {
            tracing::warn!(log_format = %ctx.config.log_format, "unknown logFormat (text or json): logging as text");
        }
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

impl Plexus {
    /// Run one verb: its context, then `f`; then its outcome line for the metrics
    /// ([`outcome::append`]; a failure to write it is logged, never the call's).
    fn call<T>(
        &self,
        verb: &str,
        args: &CmdArgs,
        f: impl FnOnce(&mut Ctx) -> Result<T, crate::error::MetaError>,
    ) -> Result<T, CniError> {
        let started = self.started.unwrap_or_else(Instant::now);
        outcome::hook_delegates();
        let mut cni_dir = None;
        let out = self.ctx(args).and_then(|mut ctx| {
            cni_dir = Some(PathBuf::from(&ctx.config.cni_dir));
            let out = f(&mut ctx);
            if matches!(verb, "ADD" | "DEL") {
                log_done(verb, args, out.is_ok(), started);
            }
            out.map_err(CniError::from)
        });
        let o = outcome::take(verb, out.as_ref().err().map(|e| e.code), started.elapsed());
        // A config that did not parse names no cniDir: the default one's.
        let cni_dir =
            cni_dir.unwrap_or_else(|| PathBuf::from(plexus_conf::plexus_config::DEFAULT_CNI_DIR));
        if let Err(e) = outcome::append(&outcome::dir_of(&cni_dir), &o) {
            tracing::warn!(error = %e, "the call's outcome is not recorded for the metrics");
        }
        out
    }
}

impl Plugin for Plexus {
    fn add(&self, args: CmdArgs) -> Result<AddOutput, CniError> {
        self.call("ADD", &args, |ctx| add::add(ctx, &mut ApiInputs, &args))
    }

    fn del(&self, args: CmdArgs) -> Result<(), CniError> {
        self.call("DEL", &args, |ctx| del::del(ctx, &mut ApiInputs, &args))
    }

    fn check(&self, args: CmdArgs) -> Result<(), CniError> {
        self.call("CHECK", &args, |ctx| verbs::check(ctx, &args))
    }

    fn status(&self, args: CmdArgs) -> Result<(), CniError> {
        self.call("STATUS", &args, verbs::status)
    }

    fn gc(&self, args: CmdArgs) -> Result<(), CniError> {
        self.call("GC", &args, |ctx| verbs::gc(ctx, &args))
    }
}
