//! CPU pinning of the benchmark's clients and servers.
//!
//! On a small machine the round trip of a blocking ping-pong depends mostly
//! on where the scheduler puts the two threads: if the woken server runs on
//! the client's CPU the hand-off is a context switch (~4 µs loopback RTT
//! here); if it runs on the other, idle CPU the wake-up crosses CPUs (~15 µs).
//! Left alone, the scheduler makes that choice differently for a thread of
//! this process and for a child process, so a comparison of the two measures
//! placement rather than protocol. Pinning makes both sides pay the same path.

use std::io;

/// Pins thread (or process) `tid` (0: the calling thread) to `cpu`.
fn set_affinity(tid: libc::pid_t, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("CPU {cpu} out of range"),
        ));
    }
    // SAFETY: `cpu_set_t` is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so the bit is inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid, initialized cpu_set_t and the size passed is its own.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The CPUs this process may run on, in order.
pub(crate) fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: as in `set_affinity`, all zeroes is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and its size is passed along.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every index is below CPU_SETSIZE, inside `set`.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Pins the calling thread; threads it starts later inherit the pinning.
pub(crate) fn pin_current(cpu: usize) -> io::Result<()> {
    set_affinity(0, cpu)
}

/// Pins every thread of process `pid` (`"self"` for this one) whose name
/// satisfies `pick`; threads they start later inherit it. Returns how many
/// threads were pinned.
pub(crate) fn pin_threads(pid: &str, cpu: usize, pick: impl Fn(&str) -> bool) -> io::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let entry = entry?;
        let Some(tid) = entry.file_name().to_str().and_then(|t| t.parse::<libc::pid_t>().ok()) else {
            continue;
        };
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if pick(name.trim_end()) {
            match set_affinity(tid, cpu) {
                Ok(()) => n += 1,
                // The thread exited in the meantime.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}
