//! The stores `bench kv` measures: one KV store per remora scheme, the same
//! store on std collections (`local`), and Redis (`redis:R[+wait]`); how
//! they are named on the command line, built, loaded and audited.

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::{Context, bail};
use remora_apps::kv::tpca::{Audit, Bank, BankError, Shape, Transfer};
use remora_apps::kv::{FarBank, HistoryLog, KvBank, KvStats, LocalTable, Row, VersionTable};
use remora_cluster::LocalCluster;
use remora_collections::{RemBTreeMap, RemVec};
use remora_runtime::{Runtime, RuntimeConfig, scheme};

use super::redis_bank::RedisBank;
use super::{KvArgs, progress};
use crate::micro::redis_server;

/// A store named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreSpec {
    /// The KV store on a runtime with this scheme.
    Remora(String),
    /// The KV store on std collections in local memory.
    Local,
    /// Redis with `replicas` replicas, `WAIT`ing for them if `wait`.
    Redis { replicas: u32, wait: bool },
}

/// Most replicas `redis:R` takes (each is a process on this machine).
const MAX_REPLICAS: u32 = 4;

impl StoreSpec {
    pub(crate) fn label(&self) -> String {
        match self {
            Self::Remora(s) => s.clone(),
            Self::Local => "local".into(),
            Self::Redis { replicas, wait } => format!("redis:{replicas}{}", if *wait { "+wait" } else { "" }),
        }
    }

    pub(crate) fn scheme(&self) -> Option<&str> {
        match self {
            Self::Remora(s) => Some(s),
            _ => None,
        }
    }

    /// Whether `--kill-at` runs this store (Figure 10a's schemes).
    pub(crate) fn is_kill_scheme(&self) -> bool {
        matches!(self.scheme(), Some("replication" | "ec-batch"))
    }
}

/// The `--store` list, `remora` expanded to the `--scheme` list.
pub(crate) fn parse(stores: &[String], schemes: &[String]) -> anyhow::Result<Vec<StoreSpec>> {
    let mut out = Vec::new();
    for s in stores {
        let s = s.trim();
        let add: Vec<StoreSpec> = match s {
            "remora" => {
                let mut names = Vec::new();
                for n in schemes {
                    if n == "all" {
                        names.extend(scheme::SCHEMES.iter().map(|i| i.name.to_string()));
                    } else if scheme::by_name(n).is_some() {
                        names.push(n.clone());
                    } else {
                        let known: Vec<&str> = scheme::SCHEMES.iter().map(|i| i.name).collect();
                        bail!("unknown scheme {n:?} (known: {}, all)", known.join(", "));
                    }
                }
                names.into_iter().map(StoreSpec::Remora).collect()
            }
            "local" => vec![StoreSpec::Local],
            redis if redis == "redis" || redis.starts_with("redis:") => {
                let rest = redis.strip_prefix("redis").unwrap_or_default().trim_start_matches(':');
                let (r, wait) = match rest.strip_suffix("+wait") {
                    Some(r) => (r, true),
                    None => (rest, false),
                };
                let replicas = if r.is_empty() {
                    2
                } else {
                    r.parse::<u32>()
                        .ok()
                        .filter(|n| *n <= MAX_REPLICAS)
                        .with_context(|| format!("--store {redis}: R is a number of replicas, 0 to {MAX_REPLICAS}"))?
                };
                vec![StoreSpec::Redis { replicas, wait }]
            }
            other => bail!("unknown store {other:?}: remora, local, redis:R or redis:R+wait"),
        };
        for a in add {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    if out.is_empty() {
        bail!("--store names no store");
    }
    Ok(out)
}

/// A bank `bench kv` can drive, and what it can say about itself.
pub(crate) trait Subject: Bank {
    /// The KV store's counters (`None` for Redis).
    fn kv_stats(&self) -> Option<KvStats>;
    /// Trims old versions (the KV store's background trimmer; Redis trims
    /// in its script).
    fn trim(&self) -> anyhow::Result<usize>;
    /// Bytes of memory Redis uses on all its servers (`None` for the KV store).
    fn redis_bytes(&self) -> Option<u64>;
}

impl<T: VersionTable<Row>, H: HistoryLog> Subject for KvBank<T, H> {
    fn kv_stats(&self) -> Option<KvStats> {
        Some(self.store().stats())
    }

    fn trim(&self) -> anyhow::Result<usize> {
        Ok(self.store().trim()?)
    }

    fn redis_bytes(&self) -> Option<u64> {
        None
    }
}

impl Subject for RedisBank {
    fn kv_stats(&self) -> Option<KvStats> {
        None
    }

    fn trim(&self) -> anyhow::Result<usize> {
        Ok(0)
    }

    fn redis_bytes(&self) -> Option<u64> {
        self.used_memory().ok()
    }
}

/// A loaded store.
pub(crate) struct Store<'a> {
    pub(crate) label: String,
    pub(crate) bank: Box<dyn Subject + 'a>,
    /// The runtime under a remora store.
    pub(crate) rt: Option<&'a Runtime>,
    /// Transfers committed, over every window (warm-ups included).
    pub(crate) committed: AtomicU64,
}

impl Bank for Box<dyn Subject + '_> {
    fn transfer(&self, t: &Transfer) -> Result<(), BankError> {
        (**self).transfer(t)
    }

    fn audit(&self) -> Result<Audit, BankError> {
        (**self).audit()
    }
}

/// A runtime of the benchmark with `scheme` and a budget of `budget` bytes.
pub(crate) fn runtime(cluster: &LocalCluster, scheme_name: &str, budget: usize) -> anyhow::Result<Runtime> {
    let mut cfg = RuntimeConfig::new(cluster.manager_addr(), budget);
    cfg.conn = cluster.conn_options();
    cfg.name = format!("bench-kv-{scheme_name}");
    cfg.scheme = scheme::by_name(scheme_name).with_context(|| format!("unknown scheme {scheme_name}"))?;
    Runtime::connect(cfg).with_context(|| format!("connecting a {scheme_name} runtime"))
}

/// A budget no run reaches: every row at every version kept, four times over.
fn unlimited(args: &KvArgs, shape: Shape) -> usize {
    (shape.rows() * remora_apps::kv::ROW_BYTES as u64 * (args.versions as u64 + 1) * 4) as usize
}

/// The KV store on `rt`, loaded.
pub(crate) fn remora_bank<'rt>(rt: &'rt Runtime, shape: Shape, versions: usize) -> anyhow::Result<FarBank<'rt>> {
    KvBank::load(RemBTreeMap::new(rt), RemVec::new(rt), shape, versions).context("loading the bank")
}

/// The peak of local bytes of a `non-ft` runtime with no limit, sampled
/// every 10 ms over `--calibrate` of transfers.
pub(crate) fn calibrate(cluster: &LocalCluster, args: &KvArgs, shape: Shape) -> anyhow::Result<u64> {
    let rt = runtime(cluster, "non-ft", unlimited(args, shape))?;
    let bank = remora_bank(&rt, shape, args.versions)?;
    let store = Store {
        label: "calibration".into(),
        bank: Box::new(bank),
        rt: Some(&rt),
        committed: AtomicU64::new(0),
    };
    let mut peak = rt.stats().local.bytes;
    let w = super::drive::drive(
        &store,
        shape,
        args.threads,
        args.calibrate,
        1,
        Duration::from_millis(10),
        &mut |_, _| {
            peak = peak.max(rt.stats().local.bytes);
        },
    );
    if w.commits == 0 {
        bail!(
            "no transfer committed in the calibration run ({} errors: {:?})",
            w.errors,
            w.first_error
        );
    }
    if rt.stats().traffic.swap_outs > 0 {
        bail!("the calibration run evicted: its budget was too small");
    }
    Ok(peak)
}

/// Builds and loads every store of `specs` (remora stores with a budget of
/// the first local ratio), calls `f` with them, and tears them down.
pub(crate) fn with_stores<R>(
    cluster: &LocalCluster,
    args: &KvArgs,
    shape: Shape,
    specs: &[StoreSpec],
    peak: u64,
    f: impl FnOnce(&[Store<'_>]) -> anyhow::Result<R>,
) -> anyhow::Result<R> {
    let budget = (peak as f64 * args.local_ratio[0]) as usize;
    let mut runtimes = Vec::new();
    for s in specs {
        if let Some(name) = s.scheme() {
            runtimes.push(runtime(cluster, name, budget)?);
        }
    }
    let mut rts = runtimes.iter();
    let mut stores = Vec::new();
    for spec in specs {
        let (bank, rt): (Box<dyn Subject + '_>, Option<&Runtime>) = match spec {
            StoreSpec::Remora(name) => {
                let rt = rts.next().expect("a runtime per remora store");
                let start = std::time::Instant::now();
                let bank = remora_bank(rt, shape, args.versions).with_context(|| format!("loading {name}"))?;
                rt.wait_for_eviction(Duration::from_secs(120))
                    .with_context(|| format!("{name}: eviction to the local ratio"))?;
                rt.pause_background(true);
                progress(format_args!(
                    "{name}: loaded in {:.1} s; {:.1} MiB local, {:.1} MiB far",
                    start.elapsed().as_secs_f64(),
                    rt.stats().local.bytes as f64 / (1 << 20) as f64,
                    rt.stats().far.bytes_used as f64 / (1 << 20) as f64
                ));
                (Box::new(bank), Some(rt))
            }
            StoreSpec::Local => (
                Box::new(
                    KvBank::load(LocalTable::default(), Mutex::new(Vec::new()), shape, args.versions)
                        .context("loading the local store")?,
                ),
                None,
            ),
            StoreSpec::Redis { replicas, wait } => {
                let bin = match redis_server::locate() {
                    Ok(b) => b,
                    Err(why) if !redis_server::required() => {
                        progress(format_args!(
                            "{}: skipped: {why}; {}",
                            spec.label(),
                            redis_server::INSTALL_HINT
                        ));
                        continue;
                    }
                    Err(why) => bail!(
                        "{}: {why} ({} is set); {}",
                        spec.label(),
                        redis_server::REQUIRE_ENV,
                        redis_server::INSTALL_HINT
                    ),
                };
                let bank = RedisBank::start(&bin, *replicas, *wait, shape, args.versions, args.threads)
                    .with_context(|| format!("starting {}", spec.label()))?;
                (Box::new(bank), None)
            }
        };
        stores.push(Store {
            label: spec.label(),
            bank,
            rt,
            committed: AtomicU64::new(0),
        });
    }
    f(&stores)
}

/// Audits every store; an audit that fails to run is an error, one that
/// finds the invariant broken is reported (and fails the run later).
pub(crate) fn audit_all(stores: &[Store<'_>], shape: Shape) -> anyhow::Result<Vec<(Audit, Result<(), String>)>> {
    let mut out = Vec::new();
    for s in stores {
        if let Some(rt) = s.rt {
            rt.pause_background(false);
        }
        let a = s.bank.audit().map_err(|e| anyhow::anyhow!("auditing {}: {e}", s.label));
        if let Some(rt) = s.rt {
            rt.pause_background(true);
        }
        let a = a?;
        let verdict = a.check(&shape, s.committed.load(std::sync::atomic::Ordering::Relaxed));
        match &verdict {
            Ok(()) => progress(format_args!(
                "{}: audit passed: {} rows verified, {} history records, Σ balances = initial + Σ history",
                s.label, a.values, a.history_records
            )),
            Err(e) => progress(format_args!("{}: AUDIT FAILED: {e}", s.label)),
        }
        out.push((a, verdict));
    }
    Ok(out)
}
