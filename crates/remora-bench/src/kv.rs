//! `remora bench kv`: the paper's transactional KV store (§5.2, §5.3) under
//! TPC-A transfers, on every scheme against the same transactions on local
//! memory and on Redis, in one run.
//!
//! 1. **Calibration.** A `non-ft` runtime with a budget no run reaches
//!    loads the bank and runs transfers for `--calibrate`; the peak of its
//!    local bytes (sampled every 10 ms) is the store's peak working set.
//!    Each local ratio's budget is that peak times the ratio, in bytes, the
//!    same for every scheme.
//! 2. **Load.** Every store is loaded: a runtime per `--scheme` (budget at
//!    the first ratio, so the far part is evicted while loading), the same
//!    store on std collections (`local`: the limit), and Redis (`redis:R`,
//!    one Lua script per transaction; `+wait` adds `WAIT R`).
//! 3. **Rounds.** At each `--local-ratio`, every runtime is given its budget
//!    and left to evict; then every store is measured in `--rounds`
//!    alternating windows (`--duration` each, after an unmeasured
//!    `--warmup`) while the others are paused, so every pair of stores has
//!    a ratio per round, taken seconds apart; the medians are printed.
//!    Figure 8 (TPS and remote memory against the local ratio) is drawn.
//! 4. **Audit.** Every store's TPC-A invariant (Σ accounts = Σ tellers =
//!    Σ branches = initial + Σ history, a history record per committed
//!    transfer) and every row's bytes are checked.
//! 5. **Kill** (`--kill-at T`): for `replication` and `ec-batch`, a run of
//!    `--kill-duration` at `--kill-ratio` in which a memory node holding the
//!    store's data is killed with SIGKILL `T` into it; throughput in 100 ms
//!    windows, the dip from the kill to the store's rebuild computed as
//!    `remora chaos` computes it, and Figure 10a drawn. Both stores are
//!    audited again after.
//!
//! Each transaction's latency is timed from its start to its commit
//! (closed loop: each thread starts the next at once). Errors (a transfer
//! that failed) are counted, never fatal during a window; a failed audit
//! fails the run.

mod drive;
mod kill;
mod plot;
mod redis_bank;
mod report;
mod subjects;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use remora_apps::kv::tpca::Shape;
use remora_proto::parse_duration;

use self::subjects::StoreSpec;

/// Arguments of `remora bench kv`.
#[derive(clap::Args, Debug, Clone)]
pub struct KvArgs {
    /// Remora schemes, comma-separated (`all`: every scheme).
    #[arg(long, default_value = "all", value_delimiter = ',')]
    pub scheme: Vec<String>,
    /// Stores, comma-separated: `remora` (one per `--scheme`), `local` (std
    /// collections, all in local memory), `redis:R` and `redis:R+wait` (a
    /// redis-server with R replicas; `+wait`: `WAIT R` after each transaction).
    #[arg(long, default_value = "remora,local,redis:2,redis:2+wait", value_delimiter = ',')]
    pub store: Vec<String>,
    /// Local ratios (local budget ÷ peak working set), comma-separated, in
    /// the order run (descending: each evicts down to the next at once).
    #[arg(long, default_value = "0.7,0.5,0.3,0.1", value_delimiter = ',')]
    pub local_ratio: Vec<f64>,
    /// Application threads running transactions.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Branches (at least 4 per thread, so branch locks do not serialise
    /// everything; 0: 4 per thread).
    #[arg(long, default_value_t = 0)]
    pub branches: u64,
    /// Accounts per branch (TPC-A: 100 000, scaled down).
    #[arg(long, default_value_t = 1000)]
    pub accounts_per_branch: u64,
    /// Versions kept per row by the trimmer.
    #[arg(long, default_value_t = 2)]
    pub versions: usize,
    /// Length of each measured window.
    #[arg(long, default_value = "1500ms", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured run before each window.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Rounds of alternating windows at each local ratio.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Length of the calibration run.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub calibrate: Duration,
    /// Kill a memory node holding data this far into a run of
    /// `replication` and of `ec-batch` (Figure 10a).
    #[arg(long, value_parser = parse_duration)]
    pub kill_at: Option<Duration>,
    /// Length of each kill run (default: `--kill-at` + 10 s).
    #[arg(long, value_parser = parse_duration)]
    pub kill_duration: Option<Duration>,
    /// Local ratio of the kill runs.
    #[arg(long, default_value_t = 0.3)]
    pub kill_ratio: f64,
    /// Where to draw Figure 8 (SVG).
    #[arg(long, default_value = "remora-kv.svg")]
    pub plot: PathBuf,
    /// Where to draw Figure 10a (SVG), with `--kill-at`.
    #[arg(long, default_value = "remora-kv-kill.svg")]
    pub kill_plot: PathBuf,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn progress(msg: std::fmt::Arguments<'_>) {
    eprintln!("[bench kv] {msg}");
}

impl KvArgs {
    fn shape(&self) -> Shape {
        let branches = if self.branches == 0 {
            4 * self.threads as u64
        } else {
            self.branches
        };
        Shape {
            branches,
            accounts_per_branch: self.accounts_per_branch,
        }
    }

    fn validate(&self) -> anyhow::Result<Vec<StoreSpec>> {
        if self.threads == 0 {
            bail!("--threads must be at least 1");
        }
        let shape = self.shape();
        if shape.branches < 4 * self.threads as u64 {
            bail!(
                "--branches {} is fewer than 4 per thread ({} threads): branch locks would serialise the run",
                shape.branches,
                self.threads
            );
        }
        if self.accounts_per_branch == 0 {
            bail!("--accounts-per-branch must be at least 1");
        }
        if self.versions == 0 {
            bail!("--versions must be at least 1");
        }
        if self.local_ratio.is_empty() || self.local_ratio.iter().any(|r| !(*r > 0.0 && *r <= 1.0)) {
            bail!("--local-ratio takes fractions in (0, 1]");
        }
        if !(self.kill_ratio > 0.0 && self.kill_ratio <= 1.0) {
            bail!("--kill-ratio is a fraction in (0, 1]");
        }
        if self.rounds == 0 || self.duration.is_zero() {
            bail!("--rounds and --duration must be above 0");
        }
        let specs = subjects::parse(&self.store, &self.scheme)?;
        if let Some(at) = self.kill_at {
            if !specs.iter().any(|s| s.is_kill_scheme()) {
                bail!(
                    "--kill-at needs replication or ec-batch among the --scheme list and remora among the --store list"
                );
            }
            if self.kill_duration.is_some_and(|d| d <= at) {
                bail!("--kill-duration must be longer than --kill-at");
            }
        }
        Ok(specs)
    }
}

/// Runs the benchmark.
pub fn run(args: &KvArgs) -> anyhow::Result<()> {
    let specs = args.validate()?;
    let shape = args.shape();
    let row_bytes = remora_apps::kv::ROW_BYTES as u64;
    progress(format_args!(
        "TPC-A: {} branches, {} tellers, {} accounts ({} rows of {} bytes, {} versions kept), {} threads",
        shape.branches,
        shape.tellers(),
        shape.accounts(),
        shape.rows(),
        row_bytes,
        args.versions,
        args.threads
    ));
    let remoras = specs.iter().filter(|s| s.scheme().is_some()).count() as u64;
    // Far room: every row at (versions + 2) versions, the history, and
    // replication's three copies twice over (holes, kept copies), for
    // every runtime at once; plus stripe groups (k+m regions) for each.
    let data = shape.rows() * row_bytes * (args.versions as u64 + 2);
    let groups = (remoras + 1) * 2 * crate::micro::MEMNODES as u64 * crate::micro::REGION_SIZE;
    let mut cluster = crate::micro::start_cluster_for(data * 6 * (remoras + 1) + groups, crate::micro::MEMNODES, 1)
        .context("starting the cluster")?;
    let peak = subjects::calibrate(&cluster, args, shape).context("the calibration run")?;
    progress(format_args!(
        "peak working set {:.1} MiB (local bytes of a non-ft runtime with no limit, over {:?} of transfers)",
        peak as f64 / (1 << 20) as f64,
        args.calibrate
    ));
    let outcome = subjects::with_stores(&cluster, args, shape, &specs, peak, |stores| {
        let cells = drive::rounds(stores, args, peak)?;
        let audits = subjects::audit_all(stores, shape)?;
        let doc = report::print(args, shape, peak, stores, &cells, &audits)?;
        report::figure8(args, shape, stores, &cells)?;
        Ok((doc, stores.iter().map(|s| s.label.clone()).collect::<Vec<_>>()))
    });
    let (mut doc, _labels) = outcome?;
    if let Some(at) = args.kill_at {
        let kills = kill::runs(&mut cluster, args, shape, &specs, peak, at)?;
        doc["kill"] = serde_json::Value::Array(kills);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
        progress(format_args!("results written to {}", path.display()));
    }
    report::fail_on_errors(&doc)
}
