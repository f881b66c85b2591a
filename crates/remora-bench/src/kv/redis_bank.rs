//! The Redis baseline of `remora bench kv`: the same TPC-A bank on a
//! `redis-server` primary with R replicas on loopback, driven the way Redis
//! users write transactions, as one Lua script per transfer.
//!
//! - **Rows.** Every branch, teller and account is a Redis list under
//!   `tpca:{key:016x}` (`key` from [`Shape::key`]) holding the row's newest
//!   `versions` values (the run's versions per row), the newest at index 0
//!   (`LPUSH` then `LTRIM`).
//! - **Transfer.** One `EVALSHA` of a script loaded at start: it reads the
//!   three rows' newest values, checks their lengths and parses their
//!   headers before it writes anything (a Lua error part-way would leave the
//!   writes before it in place: Redis does not roll scripts back), then
//!   pushes each row's next version (version + 1, balance + delta, the
//!   filler copied), trims each list, and `RPUSH`es a history record to
//!   `tpca:history`. Redis runs a script alone, so transfers are
//!   serializable. Replication is asynchronous (`redis:R`); `redis:R+wait`
//!   sends `WAIT R` in the same round trip, and fewer acknowledgements
//!   than R within [`WAIT_TIMEOUT_MS`] fail the transfer. Such a transfer's
//!   writes are on the primary all the same, as are those of a transfer
//!   whose reply was lost to a timeout: Redis cannot take them back, so
//!   after such an error the audit counts a history record the caller did
//!   not count as committed.
//! - **Audit.** Pipelined `LINDEX key 0` over every row, each value
//!   verified; the history read back with `LRANGE` in batches.
//!
//! # Value format
//!
//! A value is [`VALUE_LEN`] = 4096 ASCII bytes: a 64-byte header, then
//! 4032 bytes of filler.
//!
//! ```text
//! offset  0   'k'
//!         1   the row's key, 16 lowercase hex digits
//!        17   " v"
//!        19   the version, 20 decimal digits (0 at load)
//!        39   " b"
//!        41   the balance, a sign and 19 decimal digits (Rust `{:+020}`, C `%+020d`)
//!        61   " |\n"
//!        64   filler: 252 words splitmix(key · FILLER_MIX ^ j), j = 0..252,
//!             each as 16 lowercase hex digits
//! ```
//!
//! The filler depends on the key alone, so a value of another row, a torn
//! or truncated value, or a corrupted one fails verification; the script
//! copies it with `string.sub` and only rewrites the version and balance
//! fields, at fixed offsets.
//!
//! A history record is the ASCII text `account teller branch delta micros`
//! (row indexes within each table, the delta, and the client's wall-clock
//! time in microseconds since the epoch), like TPC-A's history row.

use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use remora_apps::kv::tpca::{Audit, Bank, BankError, INITIAL_BALANCE, Shape, Table, Transfer};

use crate::micro::redis_server::{RedisGroup, info_field};
use crate::micro::splitmix;

/// Bytes of every value.
pub(crate) const VALUE_LEN: usize = 4096;
/// Bytes of the header at the start of a value.
const HEADER_LEN: usize = 64;
/// Offset of the version's 20 digits.
const VERSION_AT: usize = 19;
/// Offset of the balance's sign and 19 digits.
const BALANCE_AT: usize = 41;
/// Width of the version and balance fields.
const FIELD_LEN: usize = 20;
/// Multiplier that spreads keys apart before the filler's word index is mixed in.
const FILLER_MIX: u64 = 0xD6E8_FEB8_6659_FD93;
/// The list of history records.
const HISTORY: &str = "tpca:history";
/// Rows per pipelined batch of the load and the audit (4 KiB each: 1 MiB a batch).
const BATCH: usize = 256;
/// History records per `LRANGE` of the audit.
const HISTORY_BATCH: i64 = 10_000;
/// How long a transfer's `WAIT` may take before the transfer counts as failed.
pub(crate) const WAIT_TIMEOUT_MS: u64 = 5_000;
/// How long the replicas get to catch up with the load.
const LOAD_WAIT_MS: u64 = 60_000;
/// Read/write timeout of every connection: a hung server fails transfers, not the run.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Connect timeout of every connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The Redis key of the row `key`.
fn redis_key(key: u64) -> String {
    format!("tpca:{key:016x}")
}

/// Appends the filler of row `key` (the value's bytes after the header).
fn push_filler(key: u64, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let seed = key.wrapping_mul(FILLER_MIX);
    for j in 0..((VALUE_LEN - HEADER_LEN) / 16) as u64 {
        let w = splitmix(seed ^ j);
        out.extend((0..16).rev().map(|n| HEX[((w >> (4 * n)) & 0xf) as usize]));
    }
}

/// The value of row `key` at `version` with `balance`.
fn encode(key: u64, version: u64, balance: i64) -> Vec<u8> {
    let mut v = Vec::with_capacity(VALUE_LEN);
    v.extend_from_slice(format!("k{key:016x} v{version:020} b{balance:+020} |\n").as_bytes());
    debug_assert_eq!(v.len(), HEADER_LEN);
    push_filler(key, &mut v);
    v
}

/// The version and balance in `value` if it is a well-formed value of row
/// `key` whose filler is `filler` (from [`push_filler`]).
fn decode(key: u64, value: &[u8], filler: &[u8]) -> Option<(u64, i64)> {
    if value.len() != VALUE_LEN || value[HEADER_LEN..] != *filler {
        return None;
    }
    let h = std::str::from_utf8(&value[..HEADER_LEN]).ok()?;
    let field = |at: usize| &h[at..at + FIELD_LEN];
    let shape_ok = h.starts_with('k')
        && u64::from_str_radix(&h[1..17], 16).ok() == Some(key)
        && h[1..17]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && &h[17..VERSION_AT] == " v"
        && &h[VERSION_AT + FIELD_LEN..BALANCE_AT] == " b"
        && &h[BALANCE_AT + FIELD_LEN..] == " |\n";
    let version = field(VERSION_AT);
    let balance = field(BALANCE_AT);
    let digits_ok = version.bytes().all(|b| b.is_ascii_digit())
        && matches!(balance.as_bytes()[0], b'+' | b'-')
        && balance[1..].bytes().all(|b| b.is_ascii_digit());
    if !(shape_ok && digits_ok) {
        return None;
    }
    Some((version.parse().ok()?, balance.parse().ok()?))
}

/// The transfer script. KEYS: the account, teller and branch rows, the
/// history list. ARGV: the delta, the versions kept, the history record.
fn script() -> String {
    format!(
        r#"
local delta = tonumber(ARGV[1])
local keep = tonumber(ARGV[2])
if not delta or not keep then
  return redis.error_reply('ERR bad arguments')
end
-- Everything is read and checked before anything is written: Redis does
-- not undo a script's writes when it fails part-way.
local olds, versions, balances = {{}}, {{}}, {{}}
for i = 1, 3 do
  local v = redis.call('LINDEX', KEYS[i], 0)
  if not v or string.len(v) ~= {len} then
    return redis.error_reply('ERR bad value of ' .. KEYS[i])
  end
  versions[i] = tonumber(string.sub(v, {v0}, {v1}))
  balances[i] = tonumber(string.sub(v, {b0}, {b1}))
  if not versions[i] or not balances[i] then
    return redis.error_reply('ERR bad header of ' .. KEYS[i])
  end
  olds[i] = v
end
for i = 1, 3 do
  local v = olds[i]
  local new = string.sub(v, 1, {v0m1}) .. string.format('%0{w}d', versions[i] + 1)
    .. string.sub(v, {v1p1}, {b0m1}) .. string.format('%+0{w}d', balances[i] + delta)
    .. string.sub(v, {b1p1})
  redis.call('LPUSH', KEYS[i], new)
  redis.call('LTRIM', KEYS[i], 0, keep - 1)
end
redis.call('RPUSH', KEYS[4], ARGV[3])
return 1
"#,
        len = VALUE_LEN,
        w = FIELD_LEN,
        // Lua strings are 1-based and string.sub's ends are inclusive.
        v0 = VERSION_AT + 1,
        v1 = VERSION_AT + FIELD_LEN,
        v0m1 = VERSION_AT,
        v1p1 = VERSION_AT + FIELD_LEN + 1,
        b0 = BALANCE_AT + 1,
        b1 = BALANCE_AT + FIELD_LEN,
        b0m1 = BALANCE_AT,
        b1p1 = BALANCE_AT + FIELD_LEN + 1,
    )
}

/// A connection with the timeouts every connection of the bank has.
fn connect(url: &str) -> anyhow::Result<redis::Connection> {
    let c = redis::Client::open(url)?.get_connection_with_timeout(CONNECT_TIMEOUT)?;
    c.set_read_timeout(Some(IO_TIMEOUT))?;
    c.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(c)
}

/// A Redis error as the bank reports it.
fn backend(what: &str, e: impl std::fmt::Display) -> BankError {
    BankError::Backend(format!("redis {what}: {e}"))
}

/// The TPC-A bank on a `redis-server` primary and its replicas.
pub(crate) struct RedisBank {
    shape: Shape,
    versions: usize,
    /// Replicas each transfer waits for (0: asynchronous replication).
    wait: u32,
    /// The transfer script's SHA1, from `SCRIPT LOAD`.
    sha: String,
    /// Idle connections to the primary; a transfer takes one and gives it
    /// back, or drops it after an error (its stream may hold a reply nobody read).
    pool: Mutex<Vec<redis::Connection>>,
    /// One connection per server, for `INFO memory`.
    info: Mutex<Vec<redis::Connection>>,
    /// Dropped last: kills and reaps the servers.
    group: RedisGroup,
}

impl RedisBank {
    /// Starts `redis-server` (`bin`) with `replicas` replicas, loads every
    /// row of `shape` at version 0 with [`INITIAL_BALANCE`] from `threads`
    /// threads (pipelined), waits for the replicas to have it, and loads
    /// the transfer script. Transfers keep each row's newest `versions`
    /// versions and, with `wait`, wait for every replica.
    pub(crate) fn start(
        bin: &Path,
        replicas: u32,
        wait: bool,
        shape: Shape,
        versions: usize,
        threads: usize,
    ) -> anyhow::Result<Self> {
        ensure!(versions >= 1, "a row keeps at least one version");
        ensure!(threads >= 1, "at least one thread");
        let group = RedisGroup::start(bin, replicas).context("starting redis-server for the TPC-A bank")?;
        let url = group.primary.url();
        let keys: Vec<u64> = shape.keys().collect();
        let chunk = keys.len().div_ceil(threads).max(1);
        // The load's connections become the transfer pool.
        let pool = thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (url, keys) = (&url, &keys);
                    let rows = &keys[(t * chunk).min(keys.len())..((t + 1) * chunk).min(keys.len())];
                    thread::Builder::new()
                        .name(format!("kv-redis-load-{t}"))
                        .spawn_scoped(s, move || load(url, rows, replicas))
                })
                .collect::<Result<_, _>>()?;
            handles
                .into_iter()
                .map(|h| h.join().map_err(|_| anyhow::anyhow!("a load thread panicked"))?)
                .collect::<anyhow::Result<Vec<_>>>()
        })?;
        let mut con = connect(&url)?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script())
            .query(&mut con)
            .context("SCRIPT LOAD of the transfer script")?;
        let info = group
            .servers()
            .map(|s| connect(&s.url()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            shape,
            versions,
            wait: if wait { replicas } else { 0 },
            sha,
            pool: Mutex::new(pool),
            info: Mutex::new(info),
            group,
        })
    }

    /// Σ of `used_memory` (`INFO memory`) over every server, the primary
    /// and its replicas: the baseline's remote memory.
    pub(crate) fn used_memory(&self) -> anyhow::Result<u64> {
        let mut cons = self.info.lock().unwrap_or_else(PoisonError::into_inner);
        let mut sum = 0;
        for (c, s) in cons.iter_mut().zip(self.group.servers()) {
            let info: String = redis::cmd("INFO")
                .arg("memory")
                .query(c)
                .with_context(|| format!("INFO memory of redis-server on port {}", s.port()))?;
            let used = info_field(&info, "used_memory")
                .and_then(|v| v.parse::<u64>().ok())
                .with_context(|| format!("no used_memory in INFO memory of port {}", s.port()))?;
            sum += used;
        }
        Ok(sum)
    }

    /// An idle connection to the primary, or a new one when all are busy.
    fn take(&self) -> Result<redis::Connection, BankError> {
        let idle = self.pool.lock().unwrap_or_else(PoisonError::into_inner).pop();
        match idle {
            Some(c) => Ok(c),
            None => connect(&self.group.primary.url()).map_err(|e| backend("connect", format!("{e:#}"))),
        }
    }

    fn give(&self, con: redis::Connection) {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner).push(con);
    }

    /// Runs `t`'s script on `con`; the replicas that acknowledged it (0 without WAIT).
    fn run(&self, con: &mut redis::Connection, t: &Transfer) -> redis::RedisResult<i64> {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let record = format!("{} {} {} {} {micros}", t.account, t.teller, t.branch, t.delta);
        let mut p = redis::pipe();
        p.cmd("EVALSHA")
            .arg(&self.sha)
            .arg(4)
            .arg(redis_key(Shape::key(Table::Account, t.account)))
            .arg(redis_key(Shape::key(Table::Teller, t.teller)))
            .arg(redis_key(Shape::key(Table::Branch, t.branch)))
            .arg(HISTORY)
            .arg(t.delta)
            .arg(self.versions)
            .arg(record)
            .ignore();
        if self.wait == 0 {
            p.query::<()>(con)?;
            return Ok(0);
        }
        let acked: Vec<i64> = p.cmd("WAIT").arg(self.wait).arg(WAIT_TIMEOUT_MS).query(con)?;
        Ok(acked.first().copied().unwrap_or(0))
    }
}

/// Loads `rows` at version 0 on a new connection to `url`, waits for
/// `replicas` replicas to have them, and returns the connection.
fn load(url: &str, rows: &[u64], replicas: u32) -> anyhow::Result<redis::Connection> {
    let mut con = connect(url)?;
    for batch in rows.chunks(BATCH) {
        let mut p = redis::pipe();
        for &k in batch {
            p.cmd("LPUSH")
                .arg(redis_key(k))
                .arg(encode(k, 0, INITIAL_BALANCE))
                .ignore();
        }
        p.query::<()>(&mut con).context("LPUSH batch of the load")?;
    }
    if replicas > 0 {
        // WAIT covers this connection's writes: every load thread waits for its own.
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(LOAD_WAIT_MS)
            .query(&mut con)
            .context("WAIT after the load")?;
        if acked < i64::from(replicas) {
            bail!("only {acked} of {replicas} replicas caught up with the load within {LOAD_WAIT_MS} ms");
        }
    }
    Ok(con)
}

impl Bank for RedisBank {
    fn transfer(&self, t: &Transfer) -> Result<(), BankError> {
        let mut con = self.take()?;
        match self.run(&mut con, t) {
            Ok(acked) => {
                self.give(con);
                if acked < i64::from(self.wait) {
                    // Committed on the primary, not known to be on the replicas.
                    return Err(BankError::Indeterminate(format!(
                        "redis WAIT: {acked} of {} replicas acknowledged within {WAIT_TIMEOUT_MS} ms",
                        self.wait
                    )));
                }
                Ok(())
            }
            // No reply: the script may or may not have run.
            Err(e) if e.is_io_error() || e.is_timeout() => Err(BankError::Indeterminate(format!("redis EVALSHA: {e}"))),
            Err(e) => Err(backend("EVALSHA", e)),
        }
    }

    fn audit(&self) -> Result<Audit, BankError> {
        let mut con = self.take()?;
        let audit = self.read_all(&mut con)?;
        self.give(con);
        Ok(audit)
    }
}

impl RedisBank {
    /// The audit on `con`; on error the connection is dropped with the result.
    fn read_all(&self, con: &mut redis::Connection) -> Result<Audit, BankError> {
        let mut a = Audit::default();
        let keys: Vec<u64> = self.shape.keys().collect();
        let mut filler = Vec::with_capacity(VALUE_LEN);
        for batch in keys.chunks(BATCH) {
            let mut p = redis::pipe();
            for &k in batch {
                p.cmd("LINDEX").arg(redis_key(k)).arg(0);
            }
            let values: Vec<Option<Vec<u8>>> = p.query(con).map_err(|e| backend("LINDEX", e))?;
            if values.len() != batch.len() {
                return Err(BankError::Backend(format!(
                    "redis LINDEX: {} replies to {} commands",
                    values.len(),
                    batch.len()
                )));
            }
            for (&k, v) in batch.iter().zip(values) {
                // A missing row counts as read and bad, so the audit's
                // check names it among the values that did not verify.
                a.values += 1;
                filler.clear();
                push_filler(k, &mut filler);
                let Some((_, balance)) = v.as_deref().and_then(|v| decode(k, v, &filler)) else {
                    a.bad_values += 1;
                    continue;
                };
                let sum = match Shape::table(k) {
                    Some(Table::Account) => &mut a.accounts,
                    Some(Table::Teller) => &mut a.tellers,
                    Some(Table::Branch) => &mut a.branches,
                    None => {
                        a.bad_values += 1;
                        continue;
                    }
                };
                *sum += i128::from(balance);
            }
        }
        let len: i64 = redis::cmd("LLEN")
            .arg(HISTORY)
            .query(con)
            .map_err(|e| backend("LLEN", e))?;
        let mut from = 0;
        while from < len {
            let to = (from + HISTORY_BATCH).min(len) - 1;
            let records: Vec<String> = redis::cmd("LRANGE")
                .arg(HISTORY)
                .arg(from)
                .arg(to)
                .query(con)
                .map_err(|e| backend("LRANGE", e))?;
            for (i, r) in records.iter().enumerate() {
                let delta = r.split(' ').nth(3).and_then(|d| d.parse::<i64>().ok()).ok_or_else(|| {
                    BankError::Backend(format!("history record {} does not parse: {r:?}", from + i as i64))
                })?;
                a.history += i128::from(delta);
                a.history_records += 1;
            }
            if records.is_empty() {
                // The list shrank under the audit: it runs with no transfer running, so this is a bug.
                return Err(BankError::Backend(format!("history list ended at {from} of {len}")));
            }
            from += records.len() as i64;
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests;
