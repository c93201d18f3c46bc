//! `plexus-test-apiserver`: runs the in-memory test Kubernetes API server until SIGTERM/SIGINT.
//!
//! Flags: `--listen ADDR` (default 127.0.0.1:0), `--kubeconfig-out PATH` (kubeconfig with a
//! generated full-access token), `--token TOKEN` (use this full-access token instead),
//! `--seed DIR` (load `*.json` objects), `--admin-token TOKEN` (enable `/_test/...`),
//! `--tls` (HTTPS with a generated CA, written into the kubeconfig).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use plexus_e2e::apiserver::generate_token;
use plexus_e2e::{Access, TestApiServer, TestApiServerOptions};

struct Args {
    listen: SocketAddr,
    kubeconfig_out: Option<PathBuf>,
    token: Option<String>,
    seed: Option<PathBuf>,
    admin_token: Option<String>,
    tls: bool,
}

fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Option<Args>> {
    let mut args = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        kubeconfig_out: None,
        token: None,
        seed: None,
        admin_token: None,
        tls: false,
    };
    let mut it = argv.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--listen" => args.listen = value()?.parse().context("--listen")?,
            "--kubeconfig-out" => args.kubeconfig_out = Some(value()?.into()),
            "--token" => args.token = Some(value()?),
            "--seed" => args.seed = Some(value()?.into()),
            "--admin-token" => args.admin_token = Some(value()?),
            "--tls" => args.tls = true,
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument {other:?}"),
        }
    }
    Ok(Some(args))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let Some(args) = parse_args(std::env::args().skip(1))? else {
        eprintln!("usage: plexus-test-apiserver [--listen ADDR] [--kubeconfig-out PATH] [--token TOKEN] [--seed DIR] [--admin-token TOKEN] [--tls]");
        return Ok(());
    };
    let server = TestApiServer::start(TestApiServerOptions {
        listen: args.listen,
        admin_token: args.admin_token,
        tls: args.tls,
    })?;
    let token = args.token.unwrap_or_else(generate_token);
    server.add_token(&token, Access::Full);
    if let Some(dir) = &args.seed {
        let n = server.load_dir(dir)?;
        eprintln!("seeded {n} objects from {}", dir.display());
    }
    if let Some(path) = &args.kubeconfig_out {
        server.write_kubeconfig(path, &token)?;
        eprintln!("wrote kubeconfig {}", path.display());
    }
    eprintln!("listening on {}", server.url());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            r = tokio::signal::ctrl_c() => r?,
        }
        Ok::<_, std::io::Error>(())
    })
    .context("waiting for a signal")?;
    eprintln!("shutting down");
    server.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Args>> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn flags() {
        let a = parse(&[
            "--listen",
            "127.0.0.1:6443",
            "--kubeconfig-out",
            "/tmp/kc",
            "--seed",
            "/s",
            "--admin-token",
            "adm",
            "--tls",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.listen, "127.0.0.1:6443".parse().unwrap());
        assert_eq!(a.kubeconfig_out, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(a.seed, Some(PathBuf::from("/s")));
        assert_eq!(a.admin_token.as_deref(), Some("adm"));
        assert!(a.tls && a.token.is_none());
        assert!(parse(&["--help"]).unwrap().is_none());
        assert!(parse(&["--listen"]).is_err());
        assert!(parse(&["--listen", "nope"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
