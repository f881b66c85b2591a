//! What a test does to one in-process node: kill it, restart it empty,
//! drain it, slow it, corrupt it, or make it fail at an exact step.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use remora_proto::msg::PeerTraffic;
use remora_proto::{ComputeId, Event, EventKind, NodeId, RegionId, SessionEvent};

use super::{NodeHandle, lock};

impl NodeHandle {
    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.node.id
    }

    /// Where its data path "listens".
    pub fn addr(&self) -> &str {
        &self.node.addr
    }

    /// Kills the node: every connection breaks, its memory is gone. With
    /// `notify`, every compute node holding one of its regions is told at
    /// once, as the manager would after its heartbeat timeout.
    pub fn kill(&self, notify: bool) {
        self.node.die();
        if notify {
            self.declare_dead();
        }
    }

    /// Tells the compute nodes holding regions here that the node is dead
    /// (the manager's verdict), and takes its regions out of the pool.
    pub fn declare_dead(&self) {
        let by_owner = self.owners(true);
        self.tell(by_owner, |node, addr, regions| EventKind::NodeDead {
            node,
            addr,
            regions,
        });
    }

    /// A planned departure, as `remora drain` makes it: the node gets no
    /// new regions, and every compute node holding some of its regions is
    /// told (`NodeDraining`); it keeps serving them until they are given
    /// back ([`NodeHandle::regions_lent`]).
    pub fn drain(&self) {
        self.node.draining.store(true, Ordering::Release);
        let by_owner = self.owners(false);
        self.tell(by_owner, |node, addr, regions| EventKind::NodeDraining {
            node,
            addr,
            regions,
        });
    }

    /// How many of this node's regions are handed out and not given back.
    pub fn regions_lent(&self) -> usize {
        let owners = lock(&self.sh.owners);
        self.node.ids.iter().filter(|r| owners.contains_key(r)).count()
    }

    /// This node's regions handed out, by owner; with `take`, taken out of
    /// the pool.
    fn owners(&self, take: bool) -> HashMap<ComputeId, Vec<RegionId>> {
        let mut by_owner: HashMap<ComputeId, Vec<RegionId>> = HashMap::new();
        let mut owners = lock(&self.sh.owners);
        for r in &self.node.ids {
            let o = if take { owners.remove(r) } else { owners.get(r).copied() };
            if let Some(o) = o {
                by_owner.entry(o).or_default().push(*r);
            }
        }
        by_owner
    }

    /// Sends each owner in `by_owner` the event `kind` makes of this node
    /// and the owner's regions here.
    fn tell(
        &self,
        by_owner: HashMap<ComputeId, Vec<RegionId>>,
        kind: impl Fn(NodeId, String, Vec<RegionId>) -> EventKind,
    ) {
        let subs = lock(&self.sh.subscribers);
        for (owner, regions) in by_owner {
            for (id, tx) in subs.iter() {
                if *id == owner {
                    let ev = Event {
                        seq: self.sh.next_event.fetch_add(1, Ordering::Relaxed),
                        kind: kind(self.node.id, self.node.addr.clone(), regions.clone()),
                    };
                    let _ = tx.send(SessionEvent::Manager(ev));
                }
            }
        }
    }

    /// The node comes back at once as a new incarnation at the same
    /// address (restarted by its supervisor): it serves, but holds none of
    /// its regions (each is revoked, so a capability for it is refused), and
    /// nobody is told; [`NodeHandle::declare_dead`] is the manager's word
    /// about the old incarnation, when a test wants it to come.
    pub fn restart_empty(&self) {
        for id in &self.node.ids {
            let _ = self.node.regions.revoke(*id, self.sh.bump_epoch(*id));
        }
    }

    /// The next `n` data requests break their connection (the node lives).
    pub fn fail_next(&self, n: u64) {
        self.node.faults.fail_next.store(n, Ordering::Release);
    }

    /// Every reply comes `d` late.
    pub fn set_delay(&self, d: Duration) {
        self.node.faults.delay_us.store(d.as_micros() as u64, Ordering::Release);
    }

    /// Connections to the node give `d` as their call timeout (10 s by
    /// default), so a test can outlast it without waiting 10 s.
    pub fn set_call_timeout(&self, d: Duration) {
        self.node
            .faults
            .call_timeout_us
            .store(d.as_micros() as u64, Ordering::Release);
    }

    /// Reads return their bytes with the first bit flipped.
    pub fn corrupt_reads(&self, on: bool) {
        self.node.faults.corrupt_reads.store(on, Ordering::Release);
    }

    /// The node dies while serving the data request after the next `n`: a
    /// write then stores only the first half of its bytes.
    pub fn die_after(&self, n: u64) {
        self.node.faults.die_after.store(n as i64, Ordering::Release);
    }

    /// The node dies at its transaction request number `n` (0: the next
    /// prepare, commit or abort it serves), before applying it, or after
    /// applying it with the reply lost (`after_applying`).
    pub fn die_at_txn(&self, n: u64, after_applying: bool) {
        let f = &self.node.faults;
        f.die_after_applying.store(after_applying, Ordering::Release);
        f.die_at_txn.store(n as i64, Ordering::Release);
    }

    /// The CPU use the node reports from now on, in thousandths of a core
    /// (see [`NodeLoad`](remora_proto::msg::NodeLoad)), standing in for a busy or idle memory node.
    pub fn set_cpu_permille(&self, permille: u32) {
        self.node.cpu_permille.store(permille, Ordering::Release);
    }

    /// The node's lease lapses, as a daemon's does when the manager stops
    /// acknowledging its heartbeats: it refuses data requests and rebuilds
    /// with `Unavailable` (and still answers `Ping` and `Stats`).
    pub fn lapse_lease(&self) {
        self.node.lease.expire();
    }

    /// The node's lease lapses at the `n`-th commit it is sent from now
    /// (0: the next), which it then refuses like every data request until
    /// [`NodeHandle::renew_lease`]; its staged changes stay.
    pub fn lapse_lease_at_commit(&self, n: u64) {
        self.node.faults.lapse_at_commit.store(n as i64, Ordering::Release);
    }

    /// At the `n`-th commit the node is sent from now (0: the next), it is
    /// cut off for `d`: that commit and every request until then break
    /// their connection unserved, as when a partition cuts the node off
    /// mid-fold. The node lives, its staged changes stay, and it serves
    /// again afterwards.
    pub fn break_at_commit(&self, n: u64, d: Duration) {
        let f = &self.node.faults;
        f.break_for_us.store(d.as_micros() as u64, Ordering::Release);
        f.break_at_commit.store(n as i64, Ordering::Release);
    }

    /// A [`NodeHandle::break_at_commit`] still waiting is called off.
    pub fn keep_commits(&self) {
        self.node.faults.break_at_commit.store(-1, Ordering::Release);
    }

    /// Whether a [`NodeHandle::break_at_commit`] still waits for its commit.
    pub fn commit_break_pending(&self) -> bool {
        self.node.faults.break_at_commit.load(Ordering::Acquire) >= 0
    }

    /// The node's lease holds again (the manager acknowledged it), and a
    /// lapse still waiting for a commit ([`NodeHandle::lapse_lease_at_commit`])
    /// is called off.
    pub fn renew_lease(&self) {
        self.node.faults.lapse_at_commit.store(-1, Ordering::Release);
        self.node.lease.hold();
    }

    /// What this node has sent to peers so far.
    pub fn peer_traffic(&self) -> PeerTraffic {
        self.node.peer.snapshot()
    }

    /// Transactions with changes staged on this node (prepared, neither
    /// committed nor aborted).
    pub fn staged_transactions(&self) -> usize {
        self.node.regions.txns.staged()
    }

    /// Whether the node serves data now: alive, with its lease holding.
    pub fn is_serving(&self) -> bool {
        !self.is_dead() && self.node.lease.valid()
    }

    /// Whether the node is dead.
    pub fn is_dead(&self) -> bool {
        self.node.faults.dead.load(Ordering::Acquire)
    }

    /// Bit rot: flips every bit of the byte at `offset` of region `region`
    /// in the node's memory, behind the protocol's back; false if the
    /// region is not here.
    pub fn rot(&self, region: RegionId, offset: u64) -> bool {
        let Ok(r) = self.node.regions.get(region) else {
            return false;
        };
        let mut g = r.write();
        match g.mem.get_mut(offset as usize) {
            Some(b) => {
                *b = !*b;
                true
            }
            None => false,
        }
    }

    /// Bytes of region `region` at `offset` (for tests that look at what a
    /// node holds); `None` if the region is not here or not granted.
    pub fn peek(&self, region: RegionId, offset: u64, len: usize) -> Option<Vec<u8>> {
        let r = self.node.regions.get(region).ok()?;
        let g = r.read();
        g.mem.get(offset as usize..offset as usize + len).map(<[u8]>::to_vec)
    }
}
