//! The nemesis of `remora chaos`: a schedule of faults drawn from a seed
//! before the run starts (so it can be printed and replayed), and the faults
//! themselves against a local cluster's memory nodes and its manager.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};

/// What happens to a memory node (or, for `Manager`, to the manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultKind {
    /// kill -9; a fresh memory node joins in its place.
    Kill,
    /// SIGSTOP, then SIGCONT after a hold on either side of the manager's
    /// heartbeat timeout: a hiccup the node must come back from, or a zombie
    /// that must never serve stale data once it was declared dead.
    Pause,
    /// All traffic dropped both ways (connections cut, requests and
    /// heartbeats unanswered) for a hold, then healed.
    Partition,
    /// kill -9 of the manager, started again on its port with its data
    /// directory after 0.5–10 s: within the memory nodes' leases, or long
    /// after they lapsed, when far memory must wait the outage out.
    Manager,
    /// kill -9 of the manager group's leader (`--managers` 3 or 5), started
    /// again as a follower after 0.5–10 s: no outage, since the others
    /// elect a new leader within the memory nodes' leases. What `manager`
    /// means in a group.
    ManagerLeader,
    /// kill -9 of m memory nodes at once with none joining for a hold of
    /// 5–15 s: a phase with fewer than k+m live nodes (the cluster starts
    /// with k+m+1 when this fault is on), in which `ec-batch` writes short
    /// spansets and re-stripes what it cannot rebuild; then m nodes join.
    Shrink,
}

impl FaultKind {
    /// Whether it kills memory nodes for good (their data must be rebuilt
    /// or re-striped).
    pub(crate) fn kills(self) -> bool {
        matches!(self, Self::Kill | Self::Shrink)
    }

    /// Whether it kills a manager (the only one, or the group's leader).
    pub(crate) fn is_manager(self) -> bool {
        matches!(self, Self::Manager | Self::ManagerLeader)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Partition => "partition",
            Self::Manager => "manager",
            Self::ManagerLeader => "manager-leader",
            Self::Shrink => "shrink",
        }
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Planned {
    /// Seconds into the run.
    pub(crate) at: f64,
    pub(crate) kind: FaultKind,
    /// How long a pause, partition or manager outage lasts (0 for a kill).
    pub(crate) hold: f64,
    /// Picks the victim among the nodes that qualify when it happens.
    pub(crate) pick: u64,
}

/// Holds span the chaos cluster's heartbeat timeout (3 s): shorter ones must
/// be ridden out, longer ones end in a rebuild and a fenced zombie.
const MAX_HOLD: f64 = 4.0;
const MIN_HOLD: f64 = 0.2;
/// Manager outages run from shorter than the memory nodes' leases (two
/// thirds of the 3 s heartbeat timeout: they keep serving) to several times
/// them (they lapse, and far memory waits).
const MANAGER_MIN: f64 = 0.5;
const MANAGER_MAX: f64 = 10.0;
/// A phase below k+m live nodes: long enough to re-stripe, short enough to
/// leave room for the other faults.
const SHRINK_MIN: f64 = 5.0;
const SHRINK_MAX: f64 = 15.0;

/// Draws the schedule: the first fault after `warm` seconds (the baseline
/// the dips are measured against), then gaps drawn around `mean_gap`, none
/// in the last `tail` seconds (the run ends calm, so recovery can finish).
pub(crate) fn plan(seed: u64, duration: f64, warm: f64, tail: f64, mean_gap: f64, kinds: &[FaultKind]) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    if kinds.is_empty() || mean_gap <= 0.0 {
        return out;
    }
    let Ok(gap) = Exp::new(1.0 / mean_gap) else {
        return out;
    };
    let mut t = warm;
    while t < duration - tail {
        let kind = kinds[rng.random_range(0..kinds.len())];
        let hold = match kind {
            FaultKind::Kill => 0.0,
            FaultKind::Pause | FaultKind::Partition => rng.random_range(MIN_HOLD..MAX_HOLD),
            FaultKind::Manager | FaultKind::ManagerLeader => rng.random_range(MANAGER_MIN..MANAGER_MAX),
            FaultKind::Shrink => rng.random_range(SHRINK_MIN..SHRINK_MAX),
        };
        out.push(Planned {
            at: t,
            kind,
            hold,
            pick: rng.random(),
        });
        // Gaps between a third and three times the mean: never a burst of
        // faults in one instant, never a long calm.
        t += gap.sample(&mut rng).clamp(mean_gap / 3.0, mean_gap * 3.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_one_schedule_inside_the_window() {
        let kinds = [
            FaultKind::Kill,
            FaultKind::Pause,
            FaultKind::Partition,
            FaultKind::Manager,
            FaultKind::Shrink,
        ];
        let a = plan(7, 60.0, 5.0, 10.0, 6.0, &kinds);
        let b = plan(7, 60.0, 5.0, 10.0, 6.0, &kinds);
        assert!(!a.is_empty());
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "same seed, same schedule");
        assert_ne!(format!("{a:?}"), format!("{:?}", plan(8, 60.0, 5.0, 10.0, 6.0, &kinds)));
        assert!(a.iter().all(|p| p.at >= 5.0 && p.at < 50.0));
        assert!(a.windows(2).all(|w| w[1].at - w[0].at >= 2.0 - 1e-9));
        for p in &a {
            match p.kind {
                FaultKind::Kill => assert_eq!(p.hold, 0.0),
                FaultKind::Manager => assert!((MANAGER_MIN..MANAGER_MAX).contains(&p.hold)),
                FaultKind::Shrink => assert!((SHRINK_MIN..SHRINK_MAX).contains(&p.hold)),
                _ => assert!((MIN_HOLD..MAX_HOLD).contains(&p.hold)),
            }
        }
        assert!(plan(7, 60.0, 5.0, 10.0, 6.0, &[]).is_empty());
        assert!(plan(7, 10.0, 5.0, 10.0, 6.0, &kinds).is_empty(), "no room for a fault");
    }
}
