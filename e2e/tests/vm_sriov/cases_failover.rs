//! A replica moves to the second node and keeps its fixed address (issue 27, item 3, at the
//! delegate level: the real `sriov` on both nodes, no kubelet yet). A client on this node's
//! VF 0 pings the replica without pause; the replica first holds the address on this node's
//! VF 1, then this node "fails" (the replica's DEL) and the second node's VF takes the address
//! with another MAC. Measured: from the second node's ADD returning (the pod is not Running
//! before that) to the client's first answer, once with the `sriov` announcement (gratuitous
//! ARP) and once without it (the address added by hand after the ADD), so the client has only
//! its stale neighbour entry to go on.
//!
//! Then the same over IPv6 (the replica's fixed `fd00:56:217::70/64`): the client's neighbour
//! entry (`ip -6 neigh`) is read right after the second node's ADD returns, before the client
//! sends anything: with the announcement (the unsolicited NA `sriov` sends once DAD is done)
//! it already names the new MAC; without it, the old one. Then the client pings and the first
//! answer is timed from the ADD's return, both ways. And DAD: while the second node holds the
//! address, this node's ADD of it fails naming it (`sriov` waits for DAD), and the client still
//! reaches the holder at the holder's MAC (nothing was announced from here).

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
/// The replica's fixed IPv6 address on VLAN 100, and the client's.
const REPLICA6: &str = "fd00:56:217::70";
const CLIENT6: &str = "fd00:56:217::71";
/// How long the client's entry is watched for the NA after the ADD returned.
const NA_WATCH: Duration = Duration::from_secs(2);
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
    let conf = on_vlan(100, &t.vf(0), &[CLIENT, CLIENT6], CLIENT_MAC);
    let r = t.dir.sriov("ADD", "client", &client.path(), &conf);
    assert_eq!(r.code, 0, "client ADD: {} {}", r.out, r.stderr);
    let announced = move_once(t, &client, true);
    let silent = move_once(t, &client, false);
    let announced6 = move6_once(t, &client, true);
    let silent6 = move6_once(t, &client, false);
    let dad = held_elsewhere(t, &client);
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
    let announced6 = announced6.expect("IPv6 move with the announcement");
    let silent6 = silent6.expect("IPv6 move without the announcement");
    assert!(
        announced6.seen_ms.is_some(),
        "with the unsolicited NA the client's entry did not name {THERE_MAC} within {NA_WATCH:?} of the ADD (the client sent nothing): {}",
        announced6.neigh_at_add
    );
    assert!(
        silent6.neigh_at_add.contains(HERE_MAC),
        "without the NA the client's entry changed before it sent anything: {}",
        silent6.neigh_at_add
    );
    for (m, how) in [(&announced6, "with"), (&silent6, "without")] {
        assert!(
            m.neigh.contains(THERE_MAC),
            "IPv6 {how} the NA: the client ended at {}, not {THERE_MAC}",
            m.neigh
        );
    }
    assert!(
        announced6.answer_ms < 2000.0,
        "IPv6 with the NA the client waited {:.0} ms",
        announced6.answer_ms
    );
    assert!(
        silent6.answer_ms > announced6.answer_ms,
        "IPv6 without the NA the client waited less ({:.0} ms) than with it ({:.0} ms)",
        silent6.answer_ms,
        announced6.answer_ms
    );
    let dad = dad.expect("an IPv6 address held on the second node");
    assert_eq!(del.code, 0, "client DEL: {}", del.out);
    stopped.expect("the second node stopped");
    t.note(format!(
        "replica {REPLICA} moved to the second node: first answer {:.0} ms after its ADD returned with the announcement (ADD {:.0} ms), {:.0} ms without it (ADD {:.0} ms)",
        announced.answer_ms, announced.add_ms, silent.answer_ms, silent.add_ms
    ));
    t.note(format!(
        "replica {REPLICA6} moved to the second node: with the unsolicited NA the client's entry named the new MAC {:.0} ms after the ADD returned (ADD {:.0} ms, DAD included), before it sent anything, first answer {:.0} ms after the ADD returned; without it the entry still named the old MAC ({}), first answer after {:.0} ms (ADD {:.0} ms)",
        announced6.seen_ms.unwrap_or_default(),
        announced6.add_ms,
        announced6.answer_ms,
        silent6.neigh_at_add.trim(),
        silent6.answer_ms,
        silent6.add_ms
    ));
    t.note(dad);
}

/// One IPv6 move of the replica.
struct Move6 {
    /// Milliseconds from the second node's ADD returning until the client's entry named the
    /// new MAC, read without the client sending anything; `None`: not within [`NA_WATCH`]
    /// (without the announcement it is not watched: read once).
    seen_ms: Option<f64>,
    /// The client's entry when the ADD returned.
    neigh_at_add: String,
    /// Milliseconds from the ADD returning to the client's first answer (pinging from after
    /// the entry was read).
    answer_ms: f64,
    /// The second node's ADD, milliseconds.
    add_ms: f64,
    /// The client's entry afterwards.
    neigh: String,
}

/// The client's IPv6 neighbour entry for the replica.
fn neigh6(client: &Netns) -> String {
    client.ip(&["-6", "neigh", "show", REPLICA6])
}

/// The replica at [`REPLICA6`] on this node's VF 1 until the client has it at [`HERE_MAC`]
/// (REACHABLE: it just answered); its DEL and the second node's ADD; then the client's entry,
/// read without sending, and its first answer.
fn move6_once(t: &T<'_>, client: &Netns, announce: bool) -> Result<Move6, String> {
    let here = Netns::new();
    let conf = on_vlan(100, &t.vf(1), &[REPLICA6], HERE_MAC);
    let id = format!("replica6-here-{announce}");
    let r = t.dir.sriov("ADD", &id, &here.path(), &conf);
    if r.code != 0 {
        return Err(format!("replica ADD here: {} {}", r.out, r.stderr));
    }
    let reached = wait_for(Duration::from_secs(20), || ping6(client, 1).is_ok());
    let neigh = neigh6(client);
    let del = t.dir.sriov("DEL", &id, &here.path(), &conf);
    if reached.is_none() {
        return Err("the client never reached the replica's IPv6 address on this node".into());
    }
    if !neigh.contains(HERE_MAC) {
        return Err(format!(
            "the client has the replica at {neigh}, not {HERE_MAC}"
        ));
    }
    if del.code != 0 {
        return Err(format!("replica DEL here: {}", del.out));
    }
    let added = peer_link::send(
        &json!({"op": "attach", "addrs": [REPLICA6], "mac": THERE_MAC, "announce": announce}),
        Duration::from_secs(60),
    )?;
    let returned = now();
    let watch = std::time::Instant::now();
    let add_ms = added["ms"].as_f64().unwrap_or(0.0);
    let neigh_at_add = neigh6(client);
    let mut seen_ms = None;
    if announce {
        loop {
            if neigh6(client).contains(THERE_MAC) {
                seen_ms = Some(watch.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            if watch.elapsed() >= NA_WATCH {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let first = first_answer(client);
    let out = first.map(|ts| Move6 {
        seen_ms,
        neigh_at_add,
        answer_ms: ((ts - returned) * 1000.0).max(0.0),
        add_ms,
        neigh: neigh6(client),
    });
    let detached = peer_link::send(&json!({"op": "detach"}), Duration::from_secs(60));
    let m = out?;
    detached?;
    Ok(m)
}

/// `count` pings from the client to [`REPLICA6`], one second each at most.
fn ping6(client: &Netns, count: u32) -> Result<String, String> {
    let n = count.to_string();
    sh(&[
        "ip",
        "netns",
        "exec",
        &client.name,
        "ping",
        "-6",
        "-c",
        &n,
        "-W",
        "1",
        REPLICA6,
    ])
}

/// The client pings [`REPLICA6`] every 20 ms: the time (`ping -D`'s clock) of its first
/// answer, within [`NO_ANSWER_LIMIT`].
fn first_answer(client: &Netns) -> Result<f64, String> {
    let mut ping = Command::new("ip")
        .args(["netns", "exec", &client.name, "ping", "-6", "-D", "-n"])
        .args(["-i", "0.02", "-W", "1", REPLICA6])
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
                let _ = tx.send(ts);
                return;
            }
        }
    });
    let got = rx.recv_timeout(NO_ANSWER_LIMIT);
    let _ = ping.kill();
    let _ = ping.wait();
    let _ = reader.join();
    got.map_err(|_| format!("no IPv6 answer within {NO_ANSWER_LIMIT:?} of the move"))
}

/// DAD across the nodes: the second node holds [`REPLICA6`] (at [`THERE_MAC`], the client
/// reaches it there); this node's ADD of the same address on VF 1 must fail naming it, leave
/// the pod netns empty, and leave the client's entry at the holder. A note with the figures.
fn held_elsewhere(t: &T<'_>, client: &Netns) -> Result<String, String> {
    peer_link::send(
        &json!({"op": "attach", "addrs": [REPLICA6], "mac": THERE_MAC, "announce": true}),
        Duration::from_secs(60),
    )?;
    let out = (|| {
        if wait_for(Duration::from_secs(20), || ping6(client, 1).is_ok()).is_none() {
            return Err("the client never reached the replica on the second node".into());
        }
        let here = Netns::new();
        let conf = on_vlan(100, &t.vf(1), &[REPLICA6], HERE_MAC);
        let started = std::time::Instant::now();
        let r = t.dir.sriov("ADD", "replica6-dup", &here.path(), &conf);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        let links = here.links();
        let after = neigh6(client);
        let ping = ping6(client, 2);
        let after_ping = neigh6(client);
        let del = t.dir.sriov("DEL", "replica6-dup", &here.path(), &conf);
        if r.code == 0 {
            return Err(format!(
                "ADD of {REPLICA6}, held on the second node, succeeded: {}",
                here.ip(&["-6", "addr", "show", "dev", "net1"])
            ));
        }
        let msg = format!(
            "{} {}",
            r.out["msg"].as_str().unwrap_or_default(),
            r.out["details"].as_str().unwrap_or_default()
        );
        if !(msg.contains(REPLICA6) && msg.contains("dadfailed") && msg.contains("net1")) {
            return Err(format!(
                "the error does not name the address and DAD: {}",
                r.out
            ));
        }
        if links != ["lo"] {
            return Err(format!("the failed ADD left {links:?} in the pod"));
        }
        if !after.contains(THERE_MAC) || !after_ping.contains(THERE_MAC) {
            return Err(format!(
                "the client's entry left the holder: {after} / after pinging {after_ping}"
            ));
        }
        ping.map_err(|e| format!("the holder stopped answering: {e}"))?;
        if del.code != 0 {
            return Err(format!("DEL after the failed ADD: {}", del.out));
        }
        Ok(format!(
            "{REPLICA6} held on the second node: this node's ADD of it failed in {ms:.0} ms by DAD (code {}: {msg}); the client still reached the holder at {THERE_MAC}",
            r.out["code"]
        ))
    })();
    let detached = peer_link::send(&json!({"op": "detach"}), Duration::from_secs(60));
    let note = out?;
    detached?;
    Ok(note)
}

/// The replica on this node's VF 1 until the client has it at [`HERE_MAC`]; then its DEL and
/// the second node's ADD; the client's first answer after that.
fn move_once(t: &T<'_>, client: &Netns, announce: bool) -> Result<Move, String> {
    let here = Netns::new();
    let conf = on_vlan(100, &t.vf(1), &[REPLICA], HERE_MAC);
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
