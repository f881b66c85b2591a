//! TPC-A-like transactions over a bank of branches, tellers and accounts,
//! and the audit that checks a run: the workload of the paper's KV-store
//! experiment (§5.2), with TPC-A's shape (1 branch : 10 tellers : 100 000
//! accounts, the accounts scaled down) and its money invariant.
//!
//! A [`Bank`] is any store that can run a [`Transfer`] atomically and audit
//! itself: the KV store on far memory ([`super::KvBank`]), the same store
//! on local memory, or a Redis server driven by a Lua script (in
//! `remora bench kv`).

use rand::Rng;

/// Tellers per branch, as in TPC-A.
pub const TELLERS_PER_BRANCH: u64 = 10;
/// The balance every branch, teller and account starts with.
pub const INITIAL_BALANCE: i64 = 1_000_000;
/// Share of transfers whose account belongs to another branch than the
/// teller's, as in TPC-A (15 %).
const REMOTE_ACCOUNT_SHARE: f64 = 0.15;
/// Deltas are drawn from `-MAX_DELTA..=MAX_DELTA`, as in TPC-A.
pub const MAX_DELTA: i64 = 999_999;

/// The bank's size: branches, and accounts per branch (tellers are
/// [`TELLERS_PER_BRANCH`] per branch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Branches.
    pub branches: u64,
    /// Accounts per branch (TPC-A has 100 000; scaled down to fit).
    pub accounts_per_branch: u64,
}

/// Which table a key belongs to; keys of the three tables are disjoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    /// A branch.
    Branch,
    /// A teller.
    Teller,
    /// An account.
    Account,
}

/// Keys of the three tables live in disjoint ranges: the table in the top
/// byte, the row below.
const TABLE_SHIFT: u32 = 56;

impl Shape {
    /// Tellers in the bank.
    pub fn tellers(&self) -> u64 {
        self.branches * TELLERS_PER_BRANCH
    }

    /// Accounts in the bank.
    pub fn accounts(&self) -> u64 {
        self.branches * self.accounts_per_branch
    }

    /// Every row: branches, tellers, accounts.
    pub fn rows(&self) -> u64 {
        self.branches + self.tellers() + self.accounts()
    }

    /// The key of row `i` of `table`.
    pub fn key(table: Table, i: u64) -> u64 {
        let t = match table {
            Table::Branch => 1u64,
            Table::Teller => 2,
            Table::Account => 3,
        };
        (t << TABLE_SHIFT) | i
    }

    /// The table of `key`.
    pub fn table(key: u64) -> Option<Table> {
        match key >> TABLE_SHIFT {
            1 => Some(Table::Branch),
            2 => Some(Table::Teller),
            3 => Some(Table::Account),
            _ => None,
        }
    }

    /// Every key of the bank: branches, then tellers, then accounts.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        let b = (0..self.branches).map(|i| Self::key(Table::Branch, i));
        let t = (0..self.tellers()).map(|i| Self::key(Table::Teller, i));
        let a = (0..self.accounts()).map(|i| Self::key(Table::Account, i));
        b.chain(t).chain(a)
    }

    /// A transfer drawn as TPC-A draws one: a teller uniformly, its branch,
    /// an account of that branch (of another one 15 % of the time, when
    /// there is another), and a delta.
    pub fn draw(&self, rng: &mut impl Rng) -> Transfer {
        let teller = rng.random_range(0..self.tellers());
        let branch = teller / TELLERS_PER_BRANCH;
        let home = if self.branches > 1 && rng.random_bool(REMOTE_ACCOUNT_SHARE) {
            // Any branch but the teller's.
            let other = rng.random_range(0..self.branches - 1);
            if other >= branch { other + 1 } else { other }
        } else {
            branch
        };
        let account = home * self.accounts_per_branch + rng.random_range(0..self.accounts_per_branch);
        Transfer {
            account,
            teller,
            branch,
            delta: rng.random_range(-MAX_DELTA..=MAX_DELTA),
        }
    }
}

/// One TPC-A transaction: read the account, the teller and the branch, add
/// `delta` to each balance (three writes), and append a history record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transfer {
    /// The account's row.
    pub account: u64,
    /// The teller's row.
    pub teller: u64,
    /// The branch's row (the teller's branch).
    pub branch: u64,
    /// The amount added to all three balances.
    pub delta: i64,
}

/// A failed transfer or audit. A failed transfer changed nothing, unless
/// the error is [`BankError::Indeterminate`].
#[derive(Debug, thiserror::Error)]
pub enum BankError {
    /// The KV store failed.
    #[error(transparent)]
    Kv(#[from] super::KvError),
    /// Another store failed (the message says how).
    #[error("{0}")]
    Backend(String),
    /// A remote store did not say whether the transfer took effect (no
    /// reply, or fewer replicas acknowledged it than asked): it may have.
    #[error("outcome unknown: {0}")]
    Indeterminate(String),
}

/// What an audit found: the sums of the three tables and of the history,
/// and how many values were read and checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audit {
    /// Σ of account balances.
    pub accounts: i128,
    /// Σ of teller balances.
    pub tellers: i128,
    /// Σ of branch balances.
    pub branches: i128,
    /// Σ of the history records' deltas.
    pub history: i128,
    /// History records.
    pub history_records: u64,
    /// Values read back (the newest version of every row).
    pub values: u64,
    /// Of those, values whose bytes did not verify (wrong key, version or
    /// filler) or that were missing.
    pub bad_values: u64,
}

impl Audit {
    /// Checks TPC-A's invariant against `shape`, after `committed`
    /// transfers reported committed: Σ accounts = Σ tellers = Σ branches =
    /// initial + Σ history, a history record per committed transfer (more
    /// only for a transfer whose commit was not reported: none here), and
    /// every value verified.
    pub fn check(&self, shape: &Shape, committed: u64) -> Result<(), String> {
        let init = |rows: u64| i128::from(INITIAL_BALANCE) * i128::from(rows);
        let mut wrong = Vec::new();
        if self.accounts != init(shape.accounts()) + self.history {
            wrong.push(format!(
                "Σ accounts {} != initial {} + Σ history {}",
                self.accounts,
                init(shape.accounts()),
                self.history
            ));
        }
        if self.tellers != init(shape.tellers()) + self.history {
            wrong.push(format!(
                "Σ tellers {} != initial {} + Σ history {}",
                self.tellers,
                init(shape.tellers()),
                self.history
            ));
        }
        if self.branches != init(shape.branches) + self.history {
            wrong.push(format!(
                "Σ branches {} != initial {} + Σ history {}",
                self.branches,
                init(shape.branches),
                self.history
            ));
        }
        if self.history_records != committed {
            wrong.push(format!(
                "{} history records for {committed} committed transfers",
                self.history_records
            ));
        }
        if self.values != shape.rows() || self.bad_values > 0 {
            wrong.push(format!(
                "{} of {} values read, {} did not verify",
                self.values,
                shape.rows(),
                self.bad_values
            ));
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    }
}

/// A store that runs TPC-A transfers.
pub trait Bank: Sync {
    /// Runs one transfer atomically and serializably: on `Err`, nothing of
    /// it took effect (but see [`BankError::Indeterminate`]).
    fn transfer(&self, t: &Transfer) -> Result<(), BankError>;
    /// Reads every row's newest value and the whole history, verifying
    /// every value (call it with no transfer running).
    fn audit(&self) -> Result<Audit, BankError>;
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn transfers_are_drawn_in_tpc_a_proportions() {
        let shape = Shape {
            branches: 8,
            accounts_per_branch: 100,
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let mut remote = 0;
        for _ in 0..10_000 {
            let t = shape.draw(&mut rng);
            assert_eq!(t.branch, t.teller / TELLERS_PER_BRANCH);
            assert!(t.account < shape.accounts() && t.teller < shape.tellers());
            assert!(t.delta.abs() <= MAX_DELTA);
            if t.account / shape.accounts_per_branch != t.branch {
                remote += 1;
            }
        }
        assert!((1200..1800).contains(&remote), "{remote} remote accounts in 10 000");
        assert_eq!(shape.keys().count() as u64, shape.rows());
        assert_eq!(Shape::table(Shape::key(Table::Teller, 5)), Some(Table::Teller));
    }

    #[test]
    fn an_audit_fails_on_any_broken_sum_count_or_value() {
        let shape = Shape {
            branches: 2,
            accounts_per_branch: 3,
        };
        let init = |rows: u64| i128::from(INITIAL_BALANCE) * i128::from(rows);
        let good = Audit {
            accounts: init(6) + 5,
            tellers: init(20) + 5,
            branches: init(2) + 5,
            history: 5,
            history_records: 1,
            values: shape.rows(),
            bad_values: 0,
        };
        good.check(&shape, 1).unwrap();
        let broken = [
            Audit {
                accounts: good.accounts + 1,
                ..good
            },
            Audit {
                tellers: good.tellers - 1,
                ..good
            },
            Audit {
                branches: good.branches + 2,
                ..good
            },
            Audit { history: 4, ..good },
            Audit {
                values: good.values - 1,
                ..good
            },
            Audit { bad_values: 1, ..good },
        ];
        for b in broken {
            assert!(b.check(&shape, 1).is_err(), "{b:?} passed");
        }
        assert!(good.check(&shape, 2).unwrap_err().contains("history records"));
    }
}
