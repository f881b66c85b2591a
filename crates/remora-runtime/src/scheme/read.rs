//! The read of a far span, whole: the one place that decides to read
//! around a member, for every scheme.
//!
//! [`read`] is all the runtime calls to bring a span back. It reads the
//! span's own far copy ([`Scheme::read_copy`]: one READ for schemes that
//! keep whole spans), verifies it against the checksum taken at eviction,
//! and when the copy cannot be read (its node is dead, suspected or
//! unreachable) or fails the checksum, reads around it
//! ([`Scheme::read_around`]: a decode from k members of its spanset), verifies
//! that too, and writes verified bytes over a corrupt copy
//! ([`Scheme::repair`]) so the redundancy that covers it stays consistent.
//! Schemes only say what happened to each step; none of them, and not the
//! runtime either, decides about members.
//!
//! Reading around is built of two shared parts: the spanset's choice of
//! members ([`super::spanset::Spanset::decode_candidates`]) and
//! [`Stripes::decode_from`] here, which gathers k of them
//! ([`super::shards::gather`]) and decodes, retried by
//! [`Stripes::until_readable`] while a stripe is only unreadable for now.

use std::time::Instant;

use remora_proto::checksum::checksum;
use remora_proto::{Cap, NodeId};

use super::retry::Retry;
use super::shards::{Shard, Stripes, gather, timed_read};
use super::{Scheme, SpanAddr};
use crate::error::{LossCause, RuntimeError};
use crate::far_memory::FarMemory;

/// What a read of a span's own far copy gave ([`Scheme::read_copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyRead {
    /// The destination holds the copy's bytes (not yet verified).
    Read,
    /// The copy cannot be read now: read around it. `failed` names the
    /// memory node whose request just failed (it becomes a suspect); `None`
    /// when the copy was not even asked for (its node is dead or already
    /// suspected, or the copy is in doubt).
    Unreadable {
        /// The node that failed a request.
        failed: Option<NodeId>,
    },
}

/// Whether a span's far copy holds exactly the bytes [`read`] returned, so
/// it can be kept for a clean re-eviction ([`Scheme::keep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verified {
    /// The far copy holds these bytes.
    Copy,
    /// The bytes are right but the far copy is not (a repair failed).
    NotCopy,
}

/// Reads the far span at `at` into `dest` (its full length) and verifies it
/// against `sum`, reading around an unreadable or corrupt copy and
/// repairing a corrupt one. A span whose copy and reconstruction both fail
/// the checksum is lost ([`LossCause::Corrupt`]).
///
/// While the span is only unreachable for now ([`RuntimeError::Unavailable`]:
/// its copy and too many members of its spanset cannot be read, none of
/// them declared dead, as when the manager is down and the memory nodes'
/// leases have lapsed) the whole read is tried again, with back-off, up to
/// the runtime's outage deadline; then it fails with `Unavailable`, never
/// with [`RuntimeError::DataLost`].
pub(crate) fn read(
    scheme: &dyn Scheme,
    far: &FarMemory,
    at: SpanAddr,
    dest: &mut [u8],
    sum: u64,
) -> Result<Verified, RuntimeError> {
    let start = Instant::now();
    let mut retry = Retry::new(far.outage_deadline());
    loop {
        match read_once(scheme, far, at, dest, sum) {
            Err(RuntimeError::Unavailable { .. }) if !far.is_stopping() && retry.wait() => {}
            Err(RuntimeError::Unavailable { span, object, why, .. }) => {
                return Err(RuntimeError::Unavailable {
                    span: span.or(Some(at)),
                    object,
                    why,
                    waited: start.elapsed(),
                });
            }
            other => return other,
        }
    }
}

fn read_once(
    scheme: &dyn Scheme,
    far: &FarMemory,
    at: SpanAddr,
    dest: &mut [u8],
    sum: u64,
) -> Result<Verified, RuntimeError> {
    let corrupt = match scheme.read_copy(far, at, dest)? {
        CopyRead::Read if checksum(dest) == sum => return Ok(Verified::Copy),
        CopyRead::Read => {
            tracing::warn!("span r{}:p{} failed its checksum; rebuilding it", at.region, at.page);
            true
        }
        CopyRead::Unreadable { failed } => {
            if let Some(node) = failed {
                far.suspect(node);
            }
            false
        }
    };
    scheme.read_around(far, at, dest)?;
    if checksum(dest) != sum {
        return Err(RuntimeError::lost(at, LossCause::Corrupt));
    }
    if !corrupt {
        return Ok(Verified::Copy);
    }
    // A corrupt far copy is handled like a lost one, then the good bytes
    // are written back so the redundancy that covers it stays consistent.
    match scheme.repair(far, at, dest) {
        Ok(()) => Ok(Verified::Copy),
        Err(e) => {
            tracing::warn!("could not rewrite repaired span r{}:p{}: {e}", at.region, at.page);
            Ok(Verified::NotCopy)
        }
    }
}

/// One READ of the member at `offset` of region `region` (the copy of a
/// span a redundant scheme can read around): the round trip feeds the
/// failure detector, and a node that cannot be reached, fails, is overdue
/// or no longer holds the region makes the copy unreadable rather than the
/// read failed.
pub(crate) fn read_member(
    far: &FarMemory,
    region: u16,
    offset: u64,
    dest: &mut [u8],
) -> Result<CopyRead, RuntimeError> {
    let (r, c) = match far.regions().reader(region) {
        Ok(x) => x,
        Err(_) => {
            return Ok(CopyRead::Unreadable {
                failed: Some(far.regions().get(region).grant.node),
            });
        }
    };
    let cap: Cap = r.grant.cap;
    match timed_read(far, &c, cap, offset, dest) {
        Ok(()) => Ok(CopyRead::Read),
        Err(e) if e.is_node_down() => {
            tracing::debug!("read from {} failed ({e}); reading around it", r.grant.addr);
            Ok(CopyRead::Unreadable {
                failed: Some(r.grant.node),
            })
        }
        // The node answered, but not with our member: it is a new
        // incarnation (restarted, or wiped after it was fenced) that the
        // manager's word has not reached us about yet. The copy is gone;
        // the node is not down, so it is not suspected.
        Err(e) if e.is_region_gone() => {
            tracing::debug!(
                "{} no longer holds region {region} ({e}); reading around it",
                r.grant.addr
            );
            Ok(CopyRead::Unreadable { failed: None })
        }
        Err(e) => Err(e.into()),
    }
}

impl Stripes {
    /// Decodes member `want` of spanset `id` in `group` into `out` from the
    /// first k of `cands` (in order of preference) to arrive: a degraded
    /// read. Fewer than k is a typed loss naming why.
    pub(crate) fn decode_from(
        &self,
        far: &FarMemory,
        group: usize,
        id: u64,
        cands: &[Shard],
        want: usize,
        out: &mut [u8],
    ) -> Result<(), RuntimeError> {
        let len = out.len();
        let mut space = vec![0u8; cands.len() * len];
        let mut dests: Vec<&mut [u8]> = space.chunks_mut(len.max(1)).collect();
        let got = gather(far, cands, &mut dests, self.k, None, &mut |_, _| true);
        if got.arrived.len() < self.k {
            return Err(self.too_few(None, group, got.arrived.len()));
        }
        let present: Vec<(usize, &[u8])> = got.arrived.iter().map(|&i| (cands[i].pos, &*dests[i])).collect();
        self.codec
            .decode_data(&present, want, out)
            .map_err(|e| RuntimeError::lost_because(None::<SpanAddr>, format!("decode of spanset {id}: {e}")))
    }

    /// Why fewer than k members of a stripe in `group` could be read
    /// (`read` arrived), for the span at `at` if one: lost when fewer than
    /// k of the group's positions survive (a node the manager declared dead
    /// never serves again); otherwise unavailable for now, and [`read`]
    /// tries again.
    pub(crate) fn too_few(&self, at: Option<SpanAddr>, group: usize, read: usize) -> RuntimeError {
        let g = self.place.group(group);
        let survivors = g.failed.iter().filter(|&&f| !f).count();
        if survivors < self.k {
            RuntimeError::lost(
                at,
                LossCause::TooFewSurvivors {
                    group,
                    survivors,
                    needed: self.k,
                },
            )
        } else {
            RuntimeError::unavailable(
                at,
                format!("{read} of the {} members a decode needs could be read", self.k),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use remora_memnode::InProcessCluster;

    use super::*;

    const GOOD: u8 = 7;

    /// A scheme whose own copy and reconstruction give scripted bytes, and
    /// which records what the read path asked of it.
    struct Scripted {
        copy: Result<CopyRead, ()>,
        copy_byte: u8,
        around_byte: Option<u8>,
        repair_fails: bool,
        calls: Mutex<Vec<&'static str>>,
    }

    impl Scripted {
        fn new(copy: Result<CopyRead, ()>, copy_byte: u8, around_byte: Option<u8>) -> Self {
            Self {
                copy,
                copy_byte,
                around_byte,
                repair_fails: false,
                calls: Mutex::new(Vec::new()),
            }
        }

        fn calls(&self) -> Vec<&'static str> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Scheme for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn swap_out(&self, _: &FarMemory, _: &[&[u8]], _: &[u64]) -> Result<Vec<SpanAddr>, RuntimeError> {
            unreachable!("the read path never writes")
        }
        fn read_copy(&self, _: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<CopyRead, RuntimeError> {
            self.calls.lock().unwrap().push("copy");
            dest.fill(self.copy_byte);
            self.copy
                .map_err(|()| RuntimeError::lost(at, LossCause::NoRedundancy { scheme: "scripted" }))
        }
        fn read_around(&self, _: &FarMemory, at: SpanAddr, dest: &mut [u8]) -> Result<(), RuntimeError> {
            self.calls.lock().unwrap().push("around");
            let b = self
                .around_byte
                .ok_or(RuntimeError::unavailable(at, "scripted: 0 of 4 members".into()))?;
            dest.fill(b);
            Ok(())
        }
        fn repair(&self, _: &FarMemory, _: SpanAddr, good: &[u8]) -> Result<(), RuntimeError> {
            self.calls.lock().unwrap().push("repair");
            assert!(good.iter().all(|&b| b == GOOD), "a repair writes verified bytes only");
            if self.repair_fails {
                return Err(RuntimeError::Config("repair refused".into()));
            }
            Ok(())
        }
        fn release(&self, _: &FarMemory, _: SpanAddr, _: u32) {}
    }

    fn run(s: &Scripted) -> (Result<Verified, RuntimeError>, Vec<u8>, FarMemory) {
        let c = InProcessCluster::new(1, 1, 1 << 20);
        let far = FarMemory::new(c.backend(), Duration::from_millis(10), Duration::from_millis(10));
        let mut dest = vec![0u8; 64];
        let sum = checksum(&[GOOD; 64]);
        let r = read(s, &far, SpanAddr { region: 0, page: 0 }, &mut dest, sum);
        (r, dest, far)
    }

    #[test]
    fn a_good_copy_is_one_read() {
        let s = Scripted::new(Ok(CopyRead::Read), GOOD, Some(GOOD));
        let (r, dest, _) = run(&s);
        assert_eq!(r.unwrap(), Verified::Copy);
        assert_eq!(dest, vec![GOOD; 64]);
        assert_eq!(s.calls(), vec!["copy"]);
    }

    #[test]
    fn an_unreadable_copy_is_read_around_and_its_node_suspected() {
        let node = NodeId(3);
        let s = Scripted::new(Ok(CopyRead::Unreadable { failed: Some(node) }), 0, Some(GOOD));
        let (r, dest, far) = run(&s);
        assert_eq!(r.unwrap(), Verified::Copy, "the copy itself was never found wrong");
        assert_eq!(dest, vec![GOOD; 64]);
        assert_eq!(s.calls(), vec!["copy", "around"], "nothing to repair");
        assert!(far.is_suspect(node));
    }

    #[test]
    fn a_corrupt_copy_is_rebuilt_then_repaired() {
        let s = Scripted::new(Ok(CopyRead::Read), 0xEE, Some(GOOD));
        let (r, dest, _) = run(&s);
        assert_eq!(r.unwrap(), Verified::Copy);
        assert_eq!(dest, vec![GOOD; 64]);
        assert_eq!(s.calls(), vec!["copy", "around", "repair"]);

        let mut s = Scripted::new(Ok(CopyRead::Read), 0xEE, Some(GOOD));
        s.repair_fails = true;
        let (r, dest, _) = run(&s);
        assert_eq!(
            r.unwrap(),
            Verified::NotCopy,
            "right bytes, but the far copy is still bad"
        );
        assert_eq!(dest, vec![GOOD; 64]);
    }

    #[test]
    fn a_bad_reconstruction_is_corrupt_and_a_failed_one_says_why() {
        let s = Scripted::new(Ok(CopyRead::Read), 0xEE, Some(0xEF));
        let (r, _, _) = run(&s);
        assert!(
            matches!(
                r,
                Err(RuntimeError::DataLost {
                    cause: LossCause::Corrupt,
                    ..
                })
            ),
            "{r:?}"
        );
        assert_eq!(s.calls(), vec!["copy", "around"], "no repair with unverified bytes");

        // Unreachable for now, not lost: tried again until the outage
        // deadline, then `Unavailable`.
        let s = Scripted::new(Ok(CopyRead::Unreadable { failed: None }), 0, None);
        let (r, _, _) = run(&s);
        assert!(
            matches!(r, Err(RuntimeError::Unavailable { span: Some(_), waited, .. }) if waited >= Duration::from_millis(10)),
            "{r:?}"
        );
        assert!(s.calls().len() >= 4, "tried again: {:?}", s.calls());

        let s = Scripted::new(Err(()), 0, Some(GOOD));
        let (r, _, _) = run(&s);
        assert!(r.is_err(), "an error reading the copy is the read's error");
        assert_eq!(s.calls(), vec!["copy"]);
    }
}
