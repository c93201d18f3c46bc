//! A replica moves to the second node and keeps its fixed address (issue 27, item 3, at the
//! delegate level: the real `sriov` on both nodes, no kubelet yet). A client on this node's
//! VF 0 pings the replica without pause; the replica first holds the address on this node's
//! VF 1, then this node "fails" (the replica's DEL) and the second node's VF takes the address
//! with another MAC. Measured: from the second node's ADD returning (the pod is not Running
//! before that) to the client's first answer, once with the `sriov` announcement (gratuitous
//! ARP) and once without it (the address added by hand after the ADD), so the client has only
//! its stale neighbour entry to go on.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::common::Netns;
use crate::guest::{Case, T};
use crate::peer::on_vlan;
use crate::peer_link;
use crate::vf::{sh, wait_for};

/// The cases of this module.
pub const CASES: &[Case] = &[(
    "a_replica_moves_to_the_second_node_keeping_its_address",
    replica_moves,
)];

/// The replica's fixed address on VLAN 100.
const REPLICA: &str = "10.56.217.70";
/// Its MAC on this node, then on the second node.
const HERE_MAC: &str = "52:54:00:27:0a:21";
const THERE_MAC: &str = "52:54:00:27:0b:21";
/// The client on this node's VF 0.
const CLIENT: &str = "10.56.217.71";
const CLIENT_MAC: &str = "52:54:00:27:0a:20";
/// How long the client may go without an answer before the case fails.
const NO_ANSWER_LIMIT: Duration = Duration::from_secs(120);

/// One move of the replica.
struct Move {
    /// Milliseconds from the second node's ADD returning to the client's first answer (an
    /// upper bound: includes the command's trip to the second node).
    answer_ms: f64,
    /// The second node's ADD, milliseconds.
    add_ms: f64,
    /// The client's neighbour entry for the replica afterwards.
    neigh: String,
}

fn replica_moves(t: &T<'_>) {
    if std::env::var("PLEXUS_VM_PEER")
        .unwrap_or_default()
        .is_empty()
    {
        t.note("second node: none booted (PLEXUS_VM_PEER_VM=0), replica move not run".into());
        return;
    }
    // The second node's VF leaves its boot-time pod: it is the replica's new home.
    peer_link::send(&json!({"op": "detach"}), Duration::from_secs(60)).expect("detach");
    let client = Netns::new();
    let conf = on_vlan(100, &t.vf(0), CLIENT, CLIENT_MAC);
    let r = t.dir.sriov("ADD", "client", &client.path(), &conf);
    assert_eq!(r.code, 0, "client ADD: {} {}", r.out, r.stderr);
    let announced = move_once(t, &client, true);
    let silent = move_once(t, &client, false);
    let del = t.dir.sriov("DEL", "client", &client.path(), &conf);
    // The last delegate case with the second node (guest.rs runs it after `peer`'s). With
    // the node cases it waits, idle, to become a kubelet node for the two-node cases (after
    // this VM's node cases: a second kubelet under TCG beside them slowed them 2-3 times);
    // otherwise its VM powers off and leaves the CPU to the rest.
    let stopped = if std::env::var("PLEXUS_VM_PEER_NODE").as_deref() == Ok("1") {
        Ok(())
    } else {
        peer_link::stop()
    };
    let announced = announced.expect("move with the announcement");
    let silent = silent.expect("move without the announcement");
    for (m, how) in [(&announced, "with"), (&silent, "without")] {
        assert!(
            m.neigh.contains(THERE_MAC),
            "{how} the announcement the client ended at {}, not the second node's {THERE_MAC}",
            m.neigh
        );
    }
    assert!(
        announced.answer_ms < 2000.0,
        "with the announcement the client waited {:.0} ms",
        announced.answer_ms
    );
    assert!(
        silent.answer_ms > announced.answer_ms,
        "without the announcement the client waited less ({:.0} ms) than with it ({:.0} ms)",
        silent.answer_ms,
        announced.answer_ms
    );
    assert_eq!(del.code, 0, "client DEL: {}", del.out);
    stopped.expect("the second node stopped");
    t.note(format!(
        "replica {REPLICA} moved to the second node: first answer {:.0} ms after its ADD returned with the announcement (ADD {:.0} ms), {:.0} ms without it (ADD {:.0} ms)",
        announced.answer_ms, announced.add_ms, silent.answer_ms, silent.add_ms
    ));
}

/// The replica on this node's VF 1 until the client has it at [`HERE_MAC`]; then its DEL and
/// the second node's ADD; the client's first answer after that.
fn move_once(t: &T<'_>, client: &Netns, announce: bool) -> Result<Move, String> {
    let here = Netns::new();
    let conf = on_vlan(100, &t.vf(1), REPLICA, HERE_MAC);
    let id = format!("replica-here-{announce}");
    let r = t.dir.sriov("ADD", &id, &here.path(), &conf);
    if r.code != 0 {
        return Err(format!("replica ADD here: {} {}", r.out, r.stderr));
    }
    let ping1 = || {
        sh(&[
            "ip",
            "netns",
            "exec",
            &client.name,
            "ping",
            "-c",
            "1",
            "-W",
            "1",
            REPLICA,
        ])
        .is_ok()
    };
    if wait_for(Duration::from_secs(20), ping1).is_none() {
        let _ = t.dir.sriov("DEL", &id, &here.path(), &conf);
        return Err("the client never reached the replica on this node".into());
    }
    let neigh = client.ip(&["neigh", "show", REPLICA]);
    if !neigh.contains(HERE_MAC) {
        let _ = t.dir.sriov("DEL", &id, &here.path(), &conf);
        return Err(format!(
            "the client has the replica at {neigh}, not {HERE_MAC}"
        ));
    }
    let mut ping = Command::new("ip")
        .args([
            "netns",
            "exec",
            &client.name,
            "ping",
            "-D",
            "-n",
            "-i",
            "0.02",
        ])
        .args(["-W", "1", REPLICA])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("ping: {e}"))?;
    let stdout = ping.stdout.take().ok_or("ping's stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<f64>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(ts) = reply_time(&line) {
                if tx.send(ts).is_err() {
                    return;
                }
            }
        }
    });
    let out = (|| {
        // A few answers from this node: the entry is fresh (REACHABLE) when it fails.
        rx.recv_timeout(Duration::from_secs(5))
            .map_err(|_| "no answer from the replica on this node".to_string())?;
        std::thread::sleep(Duration::from_millis(300));
        let del = t.dir.sriov("DEL", &id, &here.path(), &conf);
        if del.code != 0 {
            return Err(format!("replica DEL here: {}", del.out));
        }
        let sent = now();
        while rx.try_recv().is_ok() {}
        let added = peer_link::send(
            &json!({"op": "attach", "addr": REPLICA, "mac": THERE_MAC, "announce": announce}),
            Duration::from_secs(60),
        )?;
        let add_ms = added["ms"].as_f64().unwrap_or(0.0);
        let first = loop {
            let ts = rx
                .recv_timeout(NO_ANSWER_LIMIT)
                .map_err(|_| format!("no answer within {NO_ANSWER_LIMIT:?} of the move"))?;
            if ts > sent {
                break ts;
            }
        };
        Ok(Move {
            answer_ms: ((first - sent) * 1000.0 - add_ms).max(0.0),
            add_ms,
            neigh: client.ip(&["neigh", "show", REPLICA]),
        })
    })();
    let _ = ping.kill();
    let _ = ping.wait();
    let _ = reader.join();
    let detached = peer_link::send(&json!({"op": "detach"}), Duration::from_secs(60));
    let m = out?;
    detached?;
    Ok(m)
}

/// The time of an answer in `ping -D` output (`[1700000000.123456] 64 bytes from ...`).
fn reply_time(line: &str) -> Option<f64> {
    if !line.contains("bytes from") {
        return None;
    }
    line.strip_prefix('[')?.split(']').next()?.parse().ok()
}

/// Seconds since the epoch (the clock `ping -D` stamps answers with).
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
