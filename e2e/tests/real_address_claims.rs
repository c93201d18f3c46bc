//! Address claims against a real kube-apiserver (WORK IN PROGRESS, issue 27): the
//! `AddressClaim` CRD (`deploy/address-claim-crd.yaml`) applied for real; two clients (as two
//! nodes would) claim the same addresses at the same moment and exactly one wins each; a claim
//! of a pod that is gone is taken over by exactly one of two contenders; a release leaves a
//! claim another pod took over. Skipped (and passing) without `PLEXUS_K8S_BIN`.

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Barrier;

use anyhow::{ensure, Context, Result};
use plexus_e2e::realk8s::{control_plane_or_skip, setup_or_report, ControlPlane, Suite};
use plexus_meta::k8s::{ClaimHolder, ClaimOutcome, ClaimSpec, KubeClient, RetryPolicy};

const NS: &str = "bank";

fn main() -> ExitCode {
    let Some(cp) = control_plane_or_skip() else {
        return ExitCode::SUCCESS;
    };
    let setup = || -> Result<()> {
        cp.apply_file(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../deploy/address-claim-crd.yaml"),
        )?;
        cp.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/addressclaims.plexus.cni.io",
        ])?;
        cp.create_namespace(NS)
    };
    if setup_or_report("real_address_claims", &cp, setup()).is_none() {
        return ExitCode::FAILURE;
    }
    let mut suite = Suite::new("real_address_claims");
    suite.case(
        "two_nodes_claim_one_address_at_once_exactly_one_wins",
        || race(&cp),
    );
    suite.case("a_gone_holders_claim_is_taken_over_by_exactly_one", || {
        take_over(&cp)
    });
    suite.finish()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn client(cp: &ControlPlane, rt: &tokio::runtime::Runtime) -> Result<KubeClient> {
    rt.block_on(KubeClient::from_kubeconfig_path(&cp.admin_kubeconfig()))
        .context("client")
}

fn spec(addr: IpAddr, pod: &str, uid: &str, node: &str) -> ClaimSpec {
    ClaimSpec {
        network: format!("{NS}/db-net"),
        address: addr.to_string(),
        node: node.into(),
        container_id: format!("c-{pod}"),
        pod: ClaimHolder {
            name: pod.into(),
            uid: uid.into(),
        },
    }
}

/// 20 addresses, each claimed by two threads with their own connections released together.
fn race(cp: &ControlPlane) -> Result<()> {
    let n = 20;
    let barrier = Barrier::new(2);
    let outcomes: Vec<Vec<ClaimOutcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = ["node-a", "node-b"]
            .into_iter()
            .map(|node| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Vec<ClaimOutcome>> {
                    let rt = rt();
                    let c = client(cp, &rt)?;
                    let mut got = vec![];
                    for i in 0..n {
                        let addr: IpAddr = format!("10.56.100.{}", 100 + i).parse()?;
                        let sp = spec(
                            addr,
                            &format!("mysql-{i}-{node}"),
                            &format!("{node}-{i}"),
                            node,
                        );
                        barrier.wait();
                        got.push(rt.block_on(c.claim_address(NS, &sp, RetryPolicy::none()))?);
                    }
                    Ok(got)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("claimer"))
            .collect::<Result<Vec<_>>>()
    })?;
    for (i, (a, b)) in outcomes[0].iter().zip(&outcomes[1]).enumerate() {
        let wins = [a, b]
            .iter()
            .filter(|o| ***o == ClaimOutcome::Created)
            .count();
        ensure!(wins == 1, "address {i}: {a:?} / {b:?}");
        let loser = if *a == ClaimOutcome::Created { b } else { a };
        ensure!(
            matches!(loser, ClaimOutcome::HeldBy { .. }),
            "address {i}: the loser saw {loser:?}"
        );
    }
    Ok(())
}

/// The holder is gone (its claim names a UID no pod has): two contenders take over at the same
/// resourceVersion; exactly one PUT succeeds, the other is a conflict; a release by the old
/// holder's UID leaves the new claim.
fn take_over(cp: &ControlPlane) -> Result<()> {
    let rt = rt();
    let c = client(cp, &rt)?;
    let addr: IpAddr = "10.56.100.200".parse()?;
    ensure!(
        rt.block_on(c.claim_address(
            NS,
            &spec(addr, "mysql-0", "old-uid", "node-a"),
            RetryPolicy::none()
        ))? == ClaimOutcome::Created
    );
    let ClaimOutcome::HeldBy {
        resource_version, ..
    } = rt.block_on(c.claim_address(
        NS,
        &spec(addr, "mysql-0", "new-a", "node-b"),
        RetryPolicy::none(),
    ))?
    else {
        anyhow::bail!("a second claim was not refused");
    };
    let first = rt.block_on(c.take_over_claim(
        NS,
        &spec(addr, "mysql-0", "new-a", "node-b"),
        &resource_version,
    ));
    let second = rt.block_on(c.take_over_claim(
        NS,
        &spec(addr, "mysql-0", "new-b", "node-a"),
        &resource_version,
    ));
    ensure!(first.is_ok(), "first take-over: {first:?}");
    ensure!(
        second.is_err(),
        "the second take-over at the same version won too"
    );
    rt.block_on(c.release_claim(
        NS,
        &format!("{NS}/db-net"),
        addr,
        "old-uid",
        RetryPolicy::none(),
    ))?;
    ensure!(
        rt.block_on(c.claim_address(
            NS,
            &spec(addr, "mysql-0", "new-a", "node-b"),
            RetryPolicy::none()
        ))? == ClaimOutcome::AlreadyOurs,
        "the old holder's release removed the new claim"
    );
    rt.block_on(c.release_claim(
        NS,
        &format!("{NS}/db-net"),
        addr,
        "new-a",
        RetryPolicy::none(),
    ))?;
    ensure!(
        rt.block_on(c.claim_address(
            NS,
            &spec(addr, "mysql-1", "x", "node-a"),
            RetryPolicy::none()
        ))? == ClaimOutcome::Created,
        "released claim still there"
    );
    Ok(())
}
