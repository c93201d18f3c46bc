//! API tier against a real kube-apiserver + etcd (see `plexus_e2e::realk8s`).

use std::process::ExitCode;

use plexus_e2e::realk8s::{bins_or_skip, ControlPlane, Suite};

fn main() -> ExitCode {
    let Some(bins) = bins_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let cp = ControlPlane::start(&bins).expect("start control plane");
    let mut suite = Suite::new("real_api");
    suite.case("harness_smoke", || {
        cp.create_namespace("smoke")?;
        let sa = cp.get_json("/api/v1/namespaces/smoke/serviceaccounts/default")?;
        anyhow::ensure!(sa["metadata"]["name"] == "default");
        let t = cp.create_token("smoke", "default")?;
        anyhow::ensure!(t.split('.').count() == 3, "a JWT: {t}");
        let m = cp.request_totals()?;
        anyhow::ensure!(!m.is_empty());
        Ok(())
    });
    suite.finish()
}
