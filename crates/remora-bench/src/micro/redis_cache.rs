//! The baseline users run instead of far memory: `--scheme redis-cache:R`,
//! a bounded in-process cache in front of a `redis-server` primary with R
//! replicas on loopback, measured by the same worker loop as the remora
//! schemes (same objects, same verification, same Zipf stream, same writes).
//!
//! - **Cache.** A `quick_cache` of as many objects as remora's local budget
//!   holds (budget / slot bytes), keyed by object index, values the object's
//!   words. Every object sits behind a reader-writer lock, as in the remora
//!   array, so a reader never caches a version a writer is replacing.
//! - **Read.** A hit is verified in the cache; a miss GETs the object from
//!   the primary, verifies it and inserts it.
//! - **Write** (write-through). Takes the object from the cache or, on a
//!   miss, GETs it; verifies it; SETs the next version on the primary; then
//!   puts the new version in the cache. Replication is asynchronous (record
//!   `redis-cache:R`); the `redis-cache:R+wait` record (R > 0) sends
//!   `WAIT R` after every SET in the same round trip, so a write completes
//!   once R replicas have it; a WAIT that times out short of R is an error.
//! - **Fill.** The worker threads SET every object at version 0 in
//!   pipelined batches and insert each into the cache as they go, so the
//!   cache starts with what its policy kept of the fill (mostly the objects
//!   written last); each thread then WAITs for the replicas to have its
//!   writes. The `+wait` record gets a fresh cache and fill of its own.
//! - **Figures.** The measured miss ratio is cache misses / operations.
//!   Far memory is Redis `used_memory` summed over every server, sampled
//!   every 100 ms like remora's levels; the far data is the objects' bytes.
//!
//! Objects are stored as their words in little-endian order under a 4-byte
//! little-endian key (the object index).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, OptionsBuilder, UnitWeighter};
use remora_proto::ByteSize;

use super::alternate::{Contestant, Counters, Entry, Recorded};
use super::cache_sim::SimMisses;
use super::record::{Figures, Record};
use super::redis_server::{RedisGroup, info_field};
use super::worker::{self, Outcome, Store};
use super::{MicroArgs, Plan, STACK, bar, base, check, fill, progress};

/// SETs per pipelined batch of the fill.
const FILL_BATCH: usize = 256;
/// How long a `WAIT` may take before the write counts as an error.
const WAIT_TIMEOUT_MS: u64 = 5_000;
/// Read/write timeout of every connection (a hung server fails operations, not the run).
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// The Redis figures of one record.
pub(crate) struct RedisFigures {
    pub(crate) replicas: u32,
    /// Whether each SET waited for the replicas (`WAIT R`).
    pub(crate) wait: bool,
    pub(crate) version: String,
    pub(crate) pids: Vec<u32>,
    pub(crate) ports: Vec<u16>,
    pub(crate) cache_capacity: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    /// WAITs acknowledged by fewer than R replicas in time.
    pub(crate) short_waits: u64,
    /// `used_memory` summed over the servers, averaged over the samples.
    pub(crate) avg_used_memory: f64,
    pub(crate) avg_cache_objects: f64,
    pub(crate) level_samples: u64,
    /// INFO requests that failed while sampling.
    pub(crate) info_errors: u64,
    /// Bytes of the objects themselves.
    pub(crate) data_bytes: u64,
    pub(crate) object_size: usize,
}

impl RedisFigures {
    pub(crate) fn hit_ratio(&self) -> Option<f64> {
        let ops = self.hits + self.misses;
        (ops > 0).then(|| self.hits as f64 / ops as f64)
    }
}

/// Per-thread operation counters, each on its own cache line.
#[derive(Default)]
#[repr(align(128))]
struct ThreadCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    short_waits: AtomicU64,
}

/// The cache, the shadow versions and the servers.
struct RedisCache {
    /// Its own servers (the `+wait` variant gets a group of its own, so
    /// both can be measured in alternating rounds without sharing keys or
    /// `used_memory`); dropping the store kills them.
    group: RedisGroup,
    /// The servers' version.
    version: String,
    words: usize,
    cache: Cache<u32, Arc<[u64]>>,
    locks: Vec<RwLock<()>>,
    versions: Vec<AtomicU64>,
    /// Replicas each SET waits for (0: asynchronous replication).
    wait: u32,
    counters: Vec<ThreadCounters>,
    /// One connection per server, for sampling `used_memory`.
    info: Mutex<Vec<redis::Connection>>,
}

/// A worker thread's connection to the primary.
struct Worker {
    t: usize,
    con: redis::Connection,
    buf: Vec<u8>,
}

/// Counters and levels of the baseline at one instant.
#[derive(Clone, Copy)]
struct Snap {
    hits: u64,
    misses: u64,
    short_waits: u64,
    used_memory: u64,
    info_errors: u64,
    cache_len: u64,
}

fn key(i: usize) -> [u8; 4] {
    (i as u32).to_le_bytes()
}

fn encode(words: &[u64], buf: &mut Vec<u8>) {
    buf.clear();
    for w in words {
        buf.extend_from_slice(&w.to_le_bytes());
    }
}

/// The words of a stored object, or `None` if it has the wrong length.
fn decode(bytes: &[u8], words: usize) -> Option<Arc<[u64]>> {
    if bytes.len() != words * 8 {
        return None;
    }
    let mut a = [0u8; 8];
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| {
                a.copy_from_slice(c);
                u64::from_le_bytes(a)
            })
            .collect(),
    )
}

/// A cache of exactly `objects` objects: quick_cache splits its capacity
/// evenly over its shards (rounding up), so the shards are the largest power
/// of two up to 16 that divides `objects` and leaves each at least 32.
fn bounded_cache(objects: u64) -> anyhow::Result<Cache<u32, Arc<[u64]>>> {
    let mut shards = 16;
    while shards > 1 && (objects % shards != 0 || objects / shards < 32) {
        shards /= 2;
    }
    let opts = OptionsBuilder::new()
        .estimated_items_capacity(usize::try_from(objects)?)
        .weight_capacity(objects)
        .shards(shards as usize)
        .build()
        .map_err(|e| anyhow!("cache options: {e}"))?;
    Ok(Cache::with_options(
        opts,
        UnitWeighter,
        DefaultHashBuilder::default(),
        DefaultLifecycle::default(),
    ))
}

fn connect(url: &str) -> anyhow::Result<redis::Connection> {
    let c = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(5))?;
    c.set_read_timeout(Some(IO_TIMEOUT))?;
    c.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(c)
}

/// What a GET found.
enum Fetched {
    Obj(Arc<[u64]>),
    /// No such key, or a value of the wrong length.
    Bad,
}

impl RedisCache {
    fn new(group: RedisGroup, args: &MicroArgs, plan: &Plan, wait: bool) -> anyhow::Result<Self> {
        let info = group
            .servers()
            .map(|s| connect(&s.url()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            version: server_version(&group),
            words: plan.layout.object_size / 8,
            cache: bounded_cache(plan.cache_objects)?,
            locks: (0..plan.n).map(|_| RwLock::new(())).collect(),
            versions: (0..plan.n).map(|_| AtomicU64::new(0)).collect(),
            wait: if wait { group.replicas.len() as u32 } else { 0 },
            counters: (0..args.threads).map(|_| ThreadCounters::default()).collect(),
            info: Mutex::new(info),
            group,
        })
    }

    fn get(&self, w: &mut Worker, i: usize) -> redis::RedisResult<Fetched> {
        let v: Option<Vec<u8>> = redis::cmd("GET").arg(&key(i)).query(&mut w.con)?;
        Ok(match v.and_then(|b| decode(&b, self.words)) {
            Some(o) => Fetched::Obj(o),
            None => Fetched::Bad,
        })
    }

    /// SETs `w.buf` as object `i`; the replicas that acknowledged it (all of them without WAIT).
    fn set(&self, w: &mut Worker, i: usize) -> redis::RedisResult<u32> {
        if self.wait == 0 {
            redis::cmd("SET").arg(&key(i)).arg(&w.buf).query::<()>(&mut w.con)?;
            return Ok(0);
        }
        let acked: Vec<i64> = redis::pipe()
            .cmd("SET")
            .arg(&key(i))
            .arg(&w.buf)
            .ignore()
            .cmd("WAIT")
            .arg(self.wait)
            .arg(WAIT_TIMEOUT_MS)
            .query(&mut w.con)?;
        Ok(acked.first().map_or(0, |&a| u32::try_from(a).unwrap_or(0)))
    }

    /// SETs every object at version 0 from `args.threads` threads and waits for the replicas.
    fn fill(&self, args: &MicroArgs, plan: &Plan, scheme: &str) -> anyhow::Result<Duration> {
        let n = plan.n;
        let threads = u64::from(args.threads);
        progress(format_args!(
            "[{scheme}] filling {n} objects of {} ({} of values) into redis-server, cache of {} objects",
            args.object_size,
            ByteSize(n * plan.layout.object_size as u64),
            plan.cache_objects
        ));
        let pb = bar(
            n,
            "fill",
            "{prefix:>6} [{bar:30}] {pos}/{len} objects ({per_sec}, eta {eta})",
        );
        let start = Instant::now();
        let chunk = n.div_ceil(threads);
        let url = self.group.primary.url();
        let replicas = self.group.replicas.len() as u32;
        let results: Vec<anyhow::Result<()>> = thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (pb, url) = (&pb, &url);
                    let range = (t * chunk).min(n)..((t + 1) * chunk).min(n);
                    thread::Builder::new()
                        .name(format!("micro-fill-{t}"))
                        .stack_size(STACK)
                        .spawn_scoped(s, move || -> anyhow::Result<()> {
                            let mut con = connect(url)?;
                            let mut words = vec![0u64; self.words];
                            let mut buf = Vec::new();
                            let idx: Vec<u64> = range.collect();
                            for batch in idx.chunks(FILL_BATCH) {
                                let mut p = redis::pipe();
                                let mut objs = Vec::with_capacity(batch.len());
                                for &i in batch {
                                    fill(&mut words, base(i, 0));
                                    encode(&words, &mut buf);
                                    p.cmd("SET").arg(&key(i as usize)).arg(&buf).ignore();
                                    objs.push((i as u32, Arc::<[u64]>::from(&words[..])));
                                }
                                p.query::<()>(&mut con).context("SET batch")?;
                                for (i, o) in objs {
                                    self.cache.insert(i, o);
                                }
                                pb.inc(batch.len() as u64);
                            }
                            if replicas > 0 {
                                let acked: i64 = redis::cmd("WAIT")
                                    .arg(replicas)
                                    .arg(60_000)
                                    .query(&mut con)
                                    .context("WAIT after the fill")?;
                                if acked < i64::from(replicas) {
                                    bail!("only {acked} of {replicas} replicas caught up with the fill within 60 s");
                                }
                            }
                            Ok(())
                        })
                })
                .collect();
            super::join_all(handles, "fill")
        });
        pb.finish_and_clear();
        for r in results {
            r?;
        }
        let took = start.elapsed();
        let s = self.snap();
        progress(format_args!(
            "[{scheme}] filled in {:.2} s: used_memory {} over {} servers, {} objects cached",
            took.as_secs_f64(),
            ByteSize(s.used_memory),
            self.group.replicas.len() + 1,
            s.cache_len
        ));
        Ok(took)
    }

    fn figures(&self, snaps: &worker::Snaps<Snap>) -> RedisFigures {
        let (a, b) = (&snaps.first, &snaps.last);
        let k = snaps.samples.len().max(1) as f64;
        let avg = |f: fn(&Snap) -> u64| snaps.samples.iter().map(|s| f(s) as f64).sum::<f64>() / k;
        RedisFigures {
            replicas: self.group.replicas.len() as u32,
            wait: self.wait > 0,
            version: self.version.clone(),
            pids: self.group.servers().map(|s| s.pid()).collect(),
            ports: self.group.servers().map(|s| s.port()).collect(),
            cache_capacity: self.cache.capacity(),
            hits: b.hits - a.hits,
            misses: b.misses - a.misses,
            short_waits: b.short_waits - a.short_waits,
            avg_used_memory: avg(|s| s.used_memory),
            avg_cache_objects: avg(|s| s.cache_len),
            level_samples: snaps.samples.len() as u64,
            info_errors: b.info_errors + snaps.samples.iter().map(|s| s.info_errors).sum::<u64>(),
            data_bytes: self.versions.len() as u64 * (self.words as u64 * 8),
            object_size: self.words * 8,
        }
    }
}

impl Store for RedisCache {
    type Worker = Worker;
    type Snap = Snap;

    fn worker(&self, t: usize) -> anyhow::Result<Worker> {
        Ok(Worker {
            t,
            con: connect(&self.group.primary.url())?,
            buf: Vec::with_capacity(self.words * 8),
        })
    }

    fn read(&self, w: &mut Worker, i: usize) -> Outcome {
        let _g = self.locks[i].read().unwrap_or_else(PoisonError::into_inner);
        let v = self.versions[i].load(Ordering::Acquire);
        let b = base(i as u64, v);
        let c = &self.counters[w.t];
        if let Some(o) = self.cache.get(&(i as u32)) {
            c.hits.fetch_add(1, Ordering::Relaxed);
            return if check(&o, b) {
                Outcome::Ok
            } else {
                Outcome::Wrong { index: i, version: v }
            };
        }
        c.misses.fetch_add(1, Ordering::Relaxed);
        match self.get(w, i) {
            Ok(Fetched::Obj(o)) if check(&o, b) => {
                self.cache.insert(i as u32, o);
                Outcome::Ok
            }
            Ok(_) => Outcome::Wrong { index: i, version: v },
            Err(e) => Outcome::Error(format!("GET: {e}")),
        }
    }

    fn write(&self, w: &mut Worker, i: usize) -> Outcome {
        let _g = self.locks[i].write().unwrap_or_else(PoisonError::into_inner);
        let v = self.versions[i].load(Ordering::Acquire);
        let c = &self.counters[w.t];
        let cur = match self.cache.get(&(i as u32)) {
            Some(o) => {
                c.hits.fetch_add(1, Ordering::Relaxed);
                Fetched::Obj(o)
            }
            None => {
                c.misses.fetch_add(1, Ordering::Relaxed);
                match self.get(w, i) {
                    Ok(f) => f,
                    Err(e) => return Outcome::Error(format!("GET: {e}")),
                }
            }
        };
        let ok = matches!(cur, Fetched::Obj(o) if check(&o, base(i as u64, v)));
        let mut new = vec![0u64; self.words];
        fill(&mut new, base(i as u64, v + 1));
        encode(&new, &mut w.buf);
        let acked = match self.set(w, i) {
            Ok(a) => a,
            // The primary may or may not have the new version: drop the
            // cached one so the next access reads whatever it has.
            Err(e) => {
                self.cache.remove(&(i as u32));
                return Outcome::Error(format!("SET: {e}"));
            }
        };
        self.cache.insert(i as u32, Arc::from(new));
        self.versions[i].store(v + 1, Ordering::Release);
        if acked < self.wait {
            c.short_waits.fetch_add(1, Ordering::Relaxed);
            return Outcome::Error(format!(
                "WAIT: {acked} of {} replicas acknowledged within {WAIT_TIMEOUT_MS} ms",
                self.wait
            ));
        }
        if ok {
            Outcome::Ok
        } else {
            Outcome::Wrong { index: i, version: v }
        }
    }

    fn servers(&self) -> Vec<u32> {
        self.group.servers().map(|s| s.pid()).collect()
    }

    fn snap(&self) -> Snap {
        let sum = |f: fn(&ThreadCounters) -> &AtomicU64| {
            self.counters.iter().map(|c| f(c).load(Ordering::Relaxed)).sum::<u64>()
        };
        let mut used_memory = 0;
        let mut info_errors = 0;
        let mut cons = self.info.lock().unwrap_or_else(PoisonError::into_inner);
        for c in cons.iter_mut() {
            let used = redis::cmd("INFO")
                .arg("memory")
                .query::<String>(c)
                .ok()
                .and_then(|info| info_field(&info, "used_memory").and_then(|v| v.parse::<u64>().ok()));
            match used {
                Some(u) => used_memory += u,
                None => info_errors += 1,
            }
        }
        Snap {
            hits: sum(|c| &c.hits),
            misses: sum(|c| &c.misses),
            short_waits: sum(|c| &c.short_waits),
            used_memory,
            info_errors,
            cache_len: self.cache.len() as u64,
        }
    }

    fn note(&self, s0: &Snap, s: &Snap, secs: f64) -> String {
        let ops = (s.hits + s.misses).saturating_sub(s0.hits + s0.misses).max(1);
        format!(
            "{:.0} cache misses/s ({:.1} % of ops)",
            (s.misses - s0.misses) as f64 / secs,
            100.0 * (s.misses - s0.misses) as f64 / ops as f64
        )
    }
}

/// `redis-server --version`'s version, or `?`.
fn server_version(group: &RedisGroup) -> String {
    group
        .primary
        .connect()
        .ok()
        .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c).ok())
        .and_then(|info| info_field(&info, "redis_version").map(str::to_string))
        .unwrap_or_else(|| "?".to_string())
}

impl Counters for Snap {
    fn since(&self, earlier: &Self) -> Self {
        Self {
            hits: self.hits - earlier.hits,
            misses: self.misses - earlier.misses,
            short_waits: self.short_waits - earlier.short_waits,
            ..*self
        }
    }
}

impl Recorded for RedisCache {
    fn record(
        &self,
        scheme: &str,
        fill_time: Duration,
        run: worker::Run,
        sim: SimMisses,
        snaps: &worker::Snaps<Snap>,
    ) -> anyhow::Result<Record> {
        Ok(Record {
            scheme: scheme.to_string(),
            fill_time,
            figures: Figures::Redis(self.figures(snaps)),
            run,
            sim,
            rounds: Vec::new(),
        })
    }
}

/// The records of `redis-cache:R`: the asynchronous variant and, when
/// R > 0, the `+wait` one, each with its name.
fn variants(replicas: u32) -> Vec<(String, bool)> {
    let name = format!("redis-cache:{replicas}");
    let mut v = vec![(name.clone(), false)];
    if replicas > 0 {
        v.push((format!("{name}+wait"), true));
    }
    v
}

/// Starts a primary with `replicas` replicas for `scheme`, and fills a store on it.
fn open(
    args: &MicroArgs,
    plan: &Plan,
    bin: &Path,
    replicas: u32,
    scheme: &str,
    wait: bool,
) -> anyhow::Result<(RedisCache, Duration)> {
    progress(format_args!(
        "[{scheme}] starting redis-server ({}) with {replicas} replica(s) on loopback",
        bin.display()
    ));
    let group = RedisGroup::start(bin, replicas).with_context(|| format!("starting redis-server for {scheme}"))?;
    let store = RedisCache::new(group, args, plan, wait)?;
    let fill_time = store.fill(args, plan, scheme)?;
    Ok((store, fill_time))
}

/// `redis-cache:R`'s stores, filled, to be measured in alternating rounds
/// beside other stores.
pub(super) fn contestants(
    args: &MicroArgs,
    plan: &Plan,
    bin: &Path,
    replicas: u32,
) -> anyhow::Result<Vec<Box<dyn Contestant>>> {
    let mut out: Vec<Box<dyn Contestant>> = Vec::new();
    for (scheme, wait) in variants(replicas) {
        let (store, fill_time) = open(args, plan, bin, replicas, &scheme, wait)?;
        out.push(Box::new(Entry::new(&scheme, store, fill_time)));
    }
    Ok(out)
}

/// Runs `redis-cache:R` (and `redis-cache:R+wait` when R > 0) at every load.
pub(super) fn run_scheme(args: &MicroArgs, plan: &Plan, bin: &Path, replicas: u32) -> anyhow::Result<Vec<Record>> {
    let zipf = worker::zipf(args, plan.n)?;
    let mut records = Vec::new();
    for (scheme, wait) in variants(replicas) {
        let (store, fill_time) = open(args, plan, bin, replicas, &scheme, wait)?;
        for &offered in &plan.loads {
            let (mut run, snaps) =
                worker::measure(args, &store, &plan.perm, zipf.as_ref(), offered).with_context(|| match offered {
                    Some(rate) => format!("{scheme}: open loop at {rate} ops/s"),
                    None => format!("{scheme}: closed loop"),
                })?;
            let sim = super::simulate(args, plan, &scheme, &mut run, zipf.as_ref());
            records.push(store.record(&scheme, fill_time, run, sim, &snaps)?);
        }
        // Dropping the store kills and reaps its servers.
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_round_trip_little_endian() {
        let words = [1u64, 0x0102_0304_0506_0708, u64::MAX];
        let mut buf = Vec::new();
        encode(&words, &mut buf);
        assert_eq!(&buf[8..16], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(decode(&buf, 3).as_deref(), Some(&words[..]));
        assert!(decode(&buf, 2).is_none());
        assert!(decode(&buf[..23], 3).is_none());
        assert_eq!(key(258), [2, 1, 0, 0]);
    }

    #[test]
    fn cache_holds_exactly_the_budgets_objects() {
        for objects in [1u64, 31, 518, 520, 87_381, 1 << 16] {
            let c = bounded_cache(objects).unwrap();
            assert_eq!(c.capacity(), objects);
            for i in 0..objects as u32 * 2 {
                c.insert(i, Arc::from(&[u64::from(i)][..]));
            }
            assert!(c.len() as u64 <= objects, "{objects}: {}", c.len());
        }
    }
}
