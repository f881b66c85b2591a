//! The `remora` command line: bad flags and busy ports explained, and
//! daemons that exit when the process that launched them is killed.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::BIN;

/// Bad flags get a clear message and a non-zero exit, with nothing left running.
#[test]
fn bad_flags_and_busy_ports_are_explained() {
    let bin = BIN;
    let out = Command::new(bin)
        .args([
            "memnode",
            "--manager",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "lots",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid size"));
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin)
        .args([
            "manager",
            "--listen",
            &port,
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--insecure-no-auth",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen") && err.contains(&port), "{err}");
    let out = Command::new(bin)
        .args([
            "memnode",
            "--manager",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--capacity",
            "1MiB",
            "--insecure-no-auth",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("smaller than one region"));
}

/// Children of a process that dies abruptly (SIGKILL, which also covers an
/// unhandled Ctrl-C) exit on their own: each watches a lifeline pipe.
#[test]
fn daemons_exit_when_their_launcher_is_killed() {
    // The killed demo cannot remove its cluster's directory: it goes in ours.
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = Command::new(BIN)
        .env("TMPDIR", tmp.path())
        .args([
            "demo",
            "--objects",
            "2048",
            "--before",
            "30",
            "--after",
            "1",
            "--plot",
            "/dev/null",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let parent = demo.id();
    let children = |ppid: u32| -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .ok()
                    .and_then(|s| s.rsplit(')').next().map(str::to_string))
                    .and_then(|rest| rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()))
                    == Some(ppid)
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let is_daemon = |k: &u32| {
        let cmd = std::fs::read_to_string(format!("/proc/{k}/cmdline")).unwrap_or_default();
        cmd.contains("manager") || cmd.contains("memnode")
    };
    let kids = loop {
        let k = children(parent);
        // Manager + 7 memory nodes, each past its exec (a child caught
        // between fork and exec still shows the demo's command line).
        if k.len() >= 8 && k.iter().all(is_daemon) {
            break k;
        }
        assert!(Instant::now() < deadline, "the demo did not start its cluster: {k:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    demo.kill().unwrap();
    demo.wait().unwrap();
    // Generous: a memory node's exit joins its heartbeat thread, which may be
    // inside a manager call on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alive: Vec<u32> = kids
            .iter()
            .copied()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .map(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
                    .unwrap_or(false)
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "daemons outlived their killed launcher: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
