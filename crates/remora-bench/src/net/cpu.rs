//! CPU time of a server process, to tell which side bounds a throughput
//! window: a side whose server was busy nearly all of a window cannot go
//! faster than its server's CPU cost per byte allows.

use std::io;
use std::path::Path;
use std::time::Duration;

/// CPU time all threads of process `pid` have run so far, to the
/// nanosecond: the first field of each `/proc/PID/task/TID/schedstat`. A
/// thread that ended meanwhile drops out, so a delta is only meaningful
/// across a window in which the process keeps its threads (a memory node
/// serving a connection does).
pub(super) fn process_cpu(pid: u32) -> io::Result<Duration> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(Path::new("/proc").join(pid.to_string()).join("task"))? {
        // A thread may end between the listing and the read.
        let Ok(s) = std::fs::read_to_string(task?.path().join("schedstat")) else {
            continue;
        };
        let on_cpu = s.split_whitespace().next().and_then(|f| f.parse::<u64>().ok());
        ns += on_cpu.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("schedstat: {s:?}")))?;
    }
    Ok(Duration::from_nanos(ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_busy_thread_shows_in_its_process_cpu() {
        let pid = std::process::id();
        let before = process_cpu(pid).unwrap();
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let used = process_cpu(pid).unwrap() - before;
        // Spinning for 200 ms runs at least most of it, however the
        // machine is shared; far more would mean the count is not per process.
        assert!(used >= Duration::from_millis(50), "{used:?}");
        assert!(used < Duration::from_secs(5), "{used:?}");
    }
}
