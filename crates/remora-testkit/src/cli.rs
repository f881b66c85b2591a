//! Runs of the `remora` binary at `bin` (in the root package's tests,
//! `env!("CARGO_BIN_EXE_remora")`) and what they print.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `bench micro`'s small array: 2000 objects of 4 KiB, a quarter of them
/// local, so eviction, swap-ins and filtering all run within a short test.
pub const SMALL_ARRAY: &[&str] = &["--objects", "2000", "--object-size", "4KiB", "--local-ratio", "0.25"];

/// A command running `bin` with `RUST_LOG=rust_log`, to be given arguments.
pub fn command(bin: &Path, rust_log: &str) -> Command {
    let mut c = Command::new(bin);
    c.env("RUST_LOG", rust_log);
    c
}

/// Runs `bin` with `args` and `RUST_LOG=warn`, and returns what it did.
pub fn output(bin: &Path, args: &[&str]) -> Output {
    command(bin, "warn").args(args).output().expect("remora runs")
}

/// Runs `bin` with `args` and returns its stdout and stderr; fails the test,
/// showing both, unless it succeeded.
#[track_caller]
pub fn output_ok(bin: &Path, args: &[&str]) -> (String, String) {
    succeeded(&output(bin, args), &format!("remora {args:?}"))
}

/// The stdout and stderr of `out`; fails the test, showing both and naming
/// `what` ran, unless it succeeded.
#[track_caller]
pub fn succeeded(out: &Output, what: &str) -> (String, String) {
    let (stdout, stderr) = (stdout(out), stderr(out));
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Runs `bin` with `envs` and without key or TLS settings from the
/// environment; one still running after 30 s (a daemon that was let in,
/// say) is killed and fails the test rather than hanging it.
pub fn run(bin: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut child = Command::new(bin)
        .args(args)
        .env_remove("REMORA_CLUSTER_KEY_FILE")
        .env_remove("REMORA_TLS")
        .env_remove("REMORA_TLS_DIR")
        .envs(envs.iter().copied())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("remora {args:?} still running after 30 s: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A command's standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The JSON a run wrote to `path`.
#[track_caller]
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("JSON written");
    serde_json::from_str(&text).expect("valid JSON")
}

/// Starts the daemon `cmd` describes (its stderr as the caller set it) and
/// waits for its "listening on" line; the child's stdin is a pipe, so
/// dropping it tells a daemon run with `--exit-with-parent` to exit.
#[track_caller]
pub fn spawn_daemon(cmd: &mut Command) -> Child {
    let mut child = cmd
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("remora starts");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("stdout is piped"))
        .read_line(&mut ready)
        .expect("the daemon's first line");
    assert!(ready.contains("listening on"), "the daemon did not start: {ready:?}");
    child
}
