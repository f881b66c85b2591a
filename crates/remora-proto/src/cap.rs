//! Capabilities: who may touch a far-memory region.
//!
//! At allocation the manager draws a random 128-bit [`Token`] for the pair
//! (region, compute node) and hands it to both the memory node (in a
//! `Grant`) and the compute node. Every data request carries a [`Cap`]; a
//! memory node serves it only if the token matches the region's current grant,
//! so one compute node can never read or write another's far memory, and a
//! freed region's old token stops working at once.
//!
//! **Delegation.** The owner may let a peer (another memory node rebuilding a
//! lost span, computing a parity delta, or draining) act on its behalf:
//! - full access: hand over the owner capability itself (it is a bearer token);
//! - read-only access: [`Cap::read_only`] derives a token
//!   `blake3_keyed(owner_token ‖ 0…, "remora read-only" ‖ region)` that the
//!   memory node recomputes from the grant. A holder can read but not write,
//!   and cannot recover the owner token from it.
//!
//! **Epochs.** The manager numbers the assignments of each region: its
//! [`Epoch`] goes up on every change of owner (each grant, each revoke), and
//! every capability names the epoch it was issued in. A memory node refuses a
//! capability of any other epoch with `RemoteError::StaleEpoch` before looking
//! at its token, so a zombie compute node, or a peer pushing a delta on its
//! behalf after its region was reassigned, gets a typed refusal and never
//! touches the new owner's bytes. Derived tokens are keyed by the epoch too, so
//! a delegate cannot move its capability to another epoch.

use rand::RngCore;
use serde::{Deserialize, Serialize};

/// Identifier of a far-memory region, unique within one manager's lifetime
/// (persisted across restarts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RegionId(pub u64);

/// Identifier of a memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u64);

/// Identifier of a compute node (a runtime session with the manager).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ComputeId(pub u64);

impl std::fmt::Display for RegionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "r{}", self.0)
    }
}
impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "m{}", self.0)
    }
}
impl std::fmt::Display for ComputeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// The number of a region's assignment: the manager bumps it on every change
/// of the region's owner (see the module docs). 0 before the first grant.
pub type Epoch = u64;

/// An unguessable 128-bit secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Token(pub [u8; 16]);

impl Token {
    /// Draws a fresh token from the OS-seeded generator.
    pub fn random() -> Self {
        let mut b = [0u8; 16];
        rand::rng().fill_bytes(&mut b);
        Self(b)
    }

    /// The all-zero token; never granted, so it always fails a check.
    pub const ZERO: Token = Token([0; 16]);

    /// Compares in time independent of where the tokens differ.
    pub fn ct_eq(&self, other: &Token) -> bool {
        self.0.iter().zip(other.0.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    /// Lower-case hex, for passing a key on a command line.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 32 hex digits.
    pub fn from_hex(s: &str) -> Option<Token> {
        let s = s.trim().as_bytes();
        if s.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, pair) in s.chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).ok()?;
            out[i] = u8::from_str_radix(hex, 16).ok()?;
        }
        Some(Token(out))
    }

    /// The read-only token derived from this owner token for `region` in `epoch`.
    pub fn derive_read_only(&self, region: RegionId, epoch: Epoch) -> Token {
        self.derive(b"remora read-only", region, epoch)
    }

    /// The apply-delta token derived from this owner token for `region` in `epoch`.
    pub fn derive_apply_delta(&self, region: RegionId, epoch: Epoch) -> Token {
        self.derive(b"remora apply-delta", region, epoch)
    }

    /// A token for one delegated right, keyed by the owner token: a holder of
    /// the derived token learns nothing about the owner's or other rights'.
    fn derive(&self, right: &[u8], region: RegionId, epoch: Epoch) -> Token {
        let mut key = [0u8; 32];
        key[..16].copy_from_slice(&self.0);
        let mut h = blake3::Hasher::new_keyed(&key);
        h.update(right);
        h.update(&region.0.to_le_bytes());
        h.update(&epoch.to_le_bytes());
        let out = h.finalize();
        let mut t = [0u8; 16];
        t.copy_from_slice(&out.as_bytes()[..16]);
        Token(t)
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret in full into logs.
        write!(f, "Token({:02x}{:02x}…)", self.0[0], self.0[1])
    }
}

/// What a capability allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rights {
    /// Read and write: the owner's capability.
    ReadWrite,
    /// Read only: a delegated capability.
    ReadOnly,
    /// Only stage a parity delta into a member under a transaction
    /// (`TxnOp::Apply`): what the owner delegates to a data node that sends
    /// `A_ij · delta` straight to a parity node. It can neither read nor
    /// write the region otherwise.
    ApplyDelta,
}

/// A capability for one region, carried by every data request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cap {
    /// The region it opens.
    pub region: RegionId,
    /// What it allows.
    pub rights: Rights,
    /// The secret proving it.
    pub token: Token,
    /// The region's assignment it was issued in; any other is refused.
    pub epoch: Epoch,
}

impl Cap {
    /// A read-only capability for the same region, safe to hand to a peer.
    pub fn read_only(&self) -> Cap {
        match self.rights {
            Rights::ReadOnly => *self,
            Rights::ReadWrite => Cap {
                region: self.region,
                rights: Rights::ReadOnly,
                token: self.token.derive_read_only(self.region, self.epoch),
                epoch: self.epoch,
            },
            // Not derivable from a narrower right: a token that opens nothing.
            Rights::ApplyDelta => Cap {
                region: self.region,
                rights: Rights::ReadOnly,
                token: Token::ZERO,
                epoch: self.epoch,
            },
        }
    }

    /// An apply-delta capability for the same region (see
    /// [`Rights::ApplyDelta`]); only the owner's capability can derive one.
    pub fn apply_delta(&self) -> Cap {
        Cap {
            region: self.region,
            rights: Rights::ApplyDelta,
            token: match self.rights {
                Rights::ReadWrite => self.token.derive_apply_delta(self.region, self.epoch),
                Rights::ApplyDelta => self.token,
                Rights::ReadOnly => Token::ZERO,
            },
            epoch: self.epoch,
        }
    }
}

/// A secret a memory node shares with the manager only, proving that an
/// administrative request (grant, revoke, fault injection) comes from it.
pub type AdminKey = Token;

/// A compute node's session with the manager: its id and a secret that proves
/// later requests come from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The compute node.
    pub id: ComputeId,
    /// Proof of identity.
    pub secret: Token,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_distinct_and_compare() {
        let a = Token::random();
        let b = Token::random();
        assert_ne!(a, b);
        assert!(a.ct_eq(&a));
        assert!(!a.ct_eq(&b));
    }

    #[test]
    fn hex_round_trip() {
        let t = Token::random();
        assert_eq!(Token::from_hex(&t.to_hex()), Some(t));
        assert_eq!(Token::from_hex("zz"), None);
        assert_eq!(Token::from_hex(&"g".repeat(32)), None);
    }

    #[test]
    fn read_only_token_is_stable_and_region_bound() {
        let owner = Cap {
            region: RegionId(7),
            rights: Rights::ReadWrite,
            token: Token([3; 16]),
            epoch: 4,
        };
        let ro = owner.read_only();
        assert_eq!(ro.rights, Rights::ReadOnly);
        assert_eq!(ro.token, owner.read_only().token);
        assert_ne!(ro.token, owner.token);
        assert_ne!(ro.token, Token([3; 16]).derive_read_only(RegionId(8), 4));
        assert_eq!(ro.read_only(), ro);
    }

    #[test]
    fn delegates_keep_the_epoch_and_are_bound_to_it() {
        let owner = Cap {
            region: RegionId(7),
            rights: Rights::ReadWrite,
            token: Token([3; 16]),
            epoch: 4,
        };
        let next = Cap { epoch: 5, ..owner };
        for (a, b) in [
            (owner.read_only(), next.read_only()),
            (owner.apply_delta(), next.apply_delta()),
        ] {
            assert_eq!(a.epoch, 4);
            assert_eq!(b.epoch, 5);
            // The same owner token in another epoch derives another delegate.
            assert_ne!(a.token, b.token);
        }
        assert_eq!(owner.apply_delta().read_only().epoch, 4);
    }
}
