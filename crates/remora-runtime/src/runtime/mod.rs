//! The runtime handle and the operations that tie the modules together:
//! dereference (fast and slow path), allocation, free, swap-in and eviction.
//! The pointer protocol these follow is written down in [`crate::pointer`].

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

mod access;
mod background;
mod evictor;
mod filtering;
mod free;
mod kept;
mod room;
pub(crate) mod stats;
mod swap_in;

use remora_proto::ConnOptions;

use self::background::{confirm_loop, eviction_loop, notice_loop};
use self::stats::Counters;
pub use self::stats::Stats;

use crate::census::LocalCensus;
use crate::error::RuntimeError;
use crate::eviction::{Clock, EvictionPolicy};
use crate::far_memory::FarMemory;
use crate::far_page_map::{FarPageMap, FarSpan};
use crate::loom::Ordering;
use crate::object::{HEADER, RemBox, RemRc, Remotable};
use crate::object_heap::{ObjectHeap, SpanRef};
use crate::pause_gate::PauseGate;
use crate::pointer::{
    self, DIRTY, EVICTING, FAST_MASK, FRESH, HOT_MASK, HOT_SHIFT, LOCK, MOVING, PRESENT, SEALED, SHARED, Slot, far_loc,
    far_word, local_addr, local_word,
};
use crate::scheme::{NonFt, Scheme, SpanAddr};
use crate::scope::{Rcu, ScopeGuard};
use crate::slice::RemSlice;
use crate::slots::{SlotTable, owner_of};
use remora_proto::checksum::checksum;

/// How a runtime is set up.
pub struct RuntimeConfig {
    /// The manager's address.
    pub manager: String,
    /// Name shown by `remora status`.
    pub name: String,
    /// Local memory budget in bytes (spans holding objects).
    pub local_budget: usize,
    /// Eviction starts above this fraction of the budget...
    pub high_watermark: f64,
    /// ...and stops below this one. Above it, spans the filtering threads
    /// found cold go as soon as a batch of them is queued.
    pub low_watermark: f64,
    /// Fault-tolerance scheme.
    pub scheme: Box<dyn Scheme>,
    /// Which spans are cold.
    pub policy: Box<dyn EvictionPolicy>,
    /// Number of eviction threads.
    pub eviction_threads: usize,
    /// Spans evicted per batch (one grace period per batch).
    pub eviction_batch: usize,
    /// Connection options for the manager and memory nodes.
    pub conn: ConnOptions,
    /// How long an allocation outside a scope waits for eviction, and how
    /// long to wait for far memory when the manager has none.
    pub patience: Duration,
    /// How long an operation waits out far memory that is unreachable but
    /// not lost (the manager down and the memory nodes' leases lapsed, a
    /// memory node cut off but not declared dead) before failing with
    /// [`RuntimeError::Unavailable`]. Far data is reported lost
    /// ([`RuntimeError::DataLost`]) only when more members of a spanset than
    /// parity covers were declared dead by the manager or fail their checksums.
    pub outage_deadline: Duration,
    /// Number of filtering threads (paper §3.3: they move objects so spans
    /// hold only hot or only cold objects); 0 disables filtering.
    pub filtering_threads: usize,
    /// Pause between a filtering thread's rounds (each looks at the spans
    /// swapped in since the last, and every second round also sweeps a
    /// window of spans, ages their objects and moves those of mixed or
    /// sparse spans). Short, so a span swapped in for one object gives that
    /// object to a hot span and goes back soon (5 ms: bench micro, 1 KiB
    /// objects, T=2, ran ~10 % faster than at 20 ms, and 80 ms was worse
    /// again).
    pub filter_interval: Duration,
    /// A swap-in from a span of small objects (at least
    /// [`crate::size_classes::MIN_SHARED_OBJECTS`] per span) brings back
    /// only the object asked for, while filtering runs: the remote read is
    /// still one read of the whole span, checked against its checksum, and
    /// the object is copied into a local span of its class as an allocation
    /// would place it. The far span keeps its other objects; a second miss
    /// on it within 10 ms (a scan) brings them all back. `false` swaps
    /// the whole span in (the paper's swap-in; filtering then moves the
    /// object out and the rest goes back, clean, without a write).
    pub object_swap_in: bool,
}

impl RuntimeConfig {
    /// Defaults for a manager at `manager` and a local budget in bytes:
    /// `non-ft`, CLOCK, two eviction threads, one filtering thread, watermarks 97 % / 94 %
    /// (with the filter's cold spans queued for eviction, the gap between them
    /// only needs to absorb a burst of swap-ins; every byte under the
    /// watermark is cache).
    pub fn new(manager: impl Into<String>, local_budget: usize) -> Self {
        Self {
            manager: manager.into(),
            name: format!("remora-runtime-{}", std::process::id()),
            local_budget,
            high_watermark: 0.97,
            low_watermark: 0.94,
            scheme: Box::new(NonFt::default()),
            policy: Box::new(Clock),
            eviction_threads: 2,
            eviction_batch: 32,
            conn: ConnOptions::default(),
            patience: Duration::from_secs(30),
            outage_deadline: Duration::from_secs(60),
            filtering_threads: 1,
            filter_interval: Duration::from_millis(5),
            object_swap_in: true,
        }
    }
}

/// Shared state of a runtime; kept alive by the handle and by every live object.
pub(crate) struct Inner {
    rcu: Rcu,
    slots: SlotTable,
    heap: ObjectHeap,
    far: Arc<FarMemory>,
    far_map: FarPageMap,
    scheme: Box<dyn Scheme>,
    policy: Arc<dyn EvictionPolicy>,
    budget: AtomicU64,
    high: f64,
    low: f64,
    batch: usize,
    patience: Duration,
    counters: Counters,
    /// Eviction rounds under way (a round holds far pages until it commits
    /// or aborts), and filtering rounds that pin spans.
    rounds: AtomicU64,
    /// The manager expired our session: far memory is gone.
    expired: AtomicBool,
    /// A wait for eviction timed out and no span has been evicted since.
    stalled: AtomicBool,
    stop: AtomicBool,
    /// Wakes eviction threads (pressure); see `kick`.
    kick: Mutex<()>,
    kicked: Condvar,
    /// Eviction threads asleep on `kicked`.
    idle_evictors: AtomicU64,
    /// Application threads waiting for local room.
    room: room::Room,
    /// Kept far copies of swapped-in clean spans.
    kept: kept::KeptTable,
    /// Spans swapped in, for the filtering threads to look at first.
    swapped_in: filtering::SwappedIn,
    /// Filtering threads run (else nobody drains `swapped_in`).
    filtering: bool,
    /// Swap-ins from spans of small objects bring back one object (only
    /// while filtering runs; see [`RuntimeConfig::object_swap_in`]).
    object_swap_in: bool,
    /// Filtering rounds pass it (see `Runtime::pause_background`).
    filtering_gate: PauseGate,
    /// Swap-outs that fail, logged as a streak: while far memory is
    /// unreachable every eviction round fails, on every eviction thread.
    swap_out_failures: remora_proto::Repeated,
}

/// A connection to far memory and the local heap: the handle applications use.
/// Dropping it stops the background threads; objects still alive keep the
/// shared state (and their far memory) until they are dropped.
pub struct Runtime {
    inner: Arc<Inner>,
    threads: Vec<thread::JoinHandle<()>>,
    /// The thread that puts suspects to the manager: apart, because its
    /// verdict call cannot be cut short (see `Drop`).
    confirm: Option<thread::JoinHandle<()>>,
}

/// A deref scope of a runtime (see the `scope` module): references obtained
/// through it are valid until it is dropped. Not `Send`.
pub struct DerefScope<'rt> {
    inner: &'rt Inner,
    guard: ScopeGuard<'rt>,
    /// Whether a dereference in this scope has handed out a reference; see
    /// `ScopeGuard::step_out`. A plain store on the stack, so the hit path
    /// stays free of atomics.
    handed: std::cell::Cell<bool>,
}

impl DerefScope<'_> {
    pub(crate) fn inner(&self) -> &Inner {
        self.inner
    }

    /// Records that a reference from this scope was handed out.
    #[inline]
    pub(crate) fn note_handed(&self) {
        self.handed.set(true);
    }

    /// Runs a blocking wait outside the scope when nothing from it is held.
    pub(crate) fn step_out<R>(&self, f: impl FnOnce() -> R) -> R {
        self.guard.step_out(self.handed.get(), f)
    }

    /// Leaves and re-enters the scope so eviction can make progress in long
    /// loops (`&mut self`: no reference from the scope may be alive).
    pub fn renew(&mut self) {
        self.guard.renew();
    }
}

impl Runtime {
    /// Registers with the manager and starts the eviction threads.
    pub fn connect(cfg: RuntimeConfig) -> Result<Self, RuntimeError> {
        let backend = remora_proto::TcpBackend::open(&cfg.manager, &cfg.name, cfg.conn.clone())?;
        Self::with_backend(cfg, Arc::new(backend))
    }

    /// As [`Runtime::connect`], with far memory from `backend` (e.g. an
    /// in-process cluster with injected faults) instead of a manager at
    /// `cfg.manager`.
    pub fn with_backend(cfg: RuntimeConfig, backend: Arc<dyn remora_proto::FarBackend>) -> Result<Self, RuntimeError> {
        let events = backend.take_events();
        let far = Arc::new(FarMemory::new(backend, cfg.patience, cfg.outage_deadline));
        let policy: Arc<dyn EvictionPolicy> = Arc::from(cfg.policy);
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| Inner {
            rcu: Rcu::new(),
            slots: SlotTable::new(weak.as_ptr() as *const ()),
            heap: ObjectHeap::new(Arc::clone(&policy)),
            far,
            far_map: FarPageMap::default(),
            scheme: cfg.scheme,
            policy,
            budget: AtomicU64::new(cfg.local_budget as u64),
            high: cfg.high_watermark,
            low: cfg.low_watermark,
            batch: cfg.eviction_batch.max(1),
            patience: cfg.patience,
            counters: Counters::default(),
            rounds: AtomicU64::new(0),
            expired: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            kick: Mutex::new(()),
            kicked: Condvar::new(),
            idle_evictors: AtomicU64::new(0),
            room: room::Room::default(),
            kept: kept::KeptTable::default(),
            swapped_in: filtering::SwappedIn::default(),
            filtering: cfg.filtering_threads > 0,
            object_swap_in: cfg.object_swap_in && cfg.filtering_threads > 0,
            filtering_gate: PauseGate::new(),
            swap_out_failures: remora_proto::Repeated::new("swap-outs succeed", "swap-outs deferred"),
        });
        if let Err(e) = inner.scheme.start(&inner.far) {
            inner.scheme.stop();
            return Err(e);
        }
        let mut threads = Vec::new();
        for i in 0..cfg.eviction_threads.max(1) {
            let weak = Arc::downgrade(&inner);
            threads.push(
                thread::Builder::new()
                    .name(format!("remora-evict-{i}"))
                    .spawn(move || eviction_loop(&weak))
                    .map_err(|e| RuntimeError::LocalMemory(format!("cannot spawn eviction thread: {e}")))?,
            );
        }
        for i in 0..cfg.filtering_threads {
            let weak = Arc::downgrade(&inner);
            let interval = cfg.filter_interval;
            threads.push(
                thread::Builder::new()
                    .name(format!("remora-filter-{i}"))
                    .spawn(move || filtering::filtering_loop(&weak, i, interval))
                    .map_err(|e| RuntimeError::LocalMemory(format!("cannot spawn filtering thread: {e}")))?,
            );
        }
        let confirm = {
            let weak = Arc::downgrade(&inner);
            thread::Builder::new()
                .name("remora-confirm".into())
                .spawn(move || confirm_loop(&weak))
                .map_err(|e| RuntimeError::LocalMemory(format!("cannot spawn confirm thread: {e}")))?
        };
        if let Some(events) = events {
            let weak = Arc::downgrade(&inner);
            threads.push(
                thread::Builder::new()
                    .name("remora-notices".into())
                    .spawn(move || notice_loop(&weak, &events))
                    .map_err(|e| RuntimeError::LocalMemory(format!("cannot spawn notice thread: {e}")))?,
            );
        }
        Ok(Self {
            inner,
            threads,
            confirm: Some(confirm),
        })
    }

    /// Enters a deref scope on this thread.
    ///
    /// Entering an outermost scope is where an application thread waits when
    /// local memory is over budget: it holds no reference then, so the
    /// eviction threads can never be waiting for it. (Inside a scope, swap-ins
    /// never wait; this bounds how far they can overshoot.)
    pub fn scope(&self) -> DerefScope<'_> {
        let inner = &*self.inner;
        if inner.heap.bytes_in_use() as u64 > inner.budget()
            && !inner.stalled.load(StdOrdering::Acquire)
            && !inner.rcu.in_scope()
        {
            inner.kick();
            if let Err(e) = inner.wait_below(inner.budget(), inner.patience) {
                // Don't make every later scope wait as long: until eviction
                // makes progress again, the budget is left soft.
                inner.stalled.store(true, StdOrdering::Release);
                tracing::warn!("entering a scope over budget: {e}");
            }
        }
        self.inner.bare_scope()
    }

    /// Places `value` in a new object owned by a unique pointer.
    pub fn alloc<T: Remotable>(&self, value: T) -> Result<RemBox<T>, RuntimeError> {
        Ok(RemBox::from_slot(self.inner.alloc_object(value, 0)?))
    }

    /// Places `value` in a new object owned by a shared pointer.
    pub fn alloc_shared<T: Remotable>(&self, value: T) -> Result<RemRc<T>, RuntimeError> {
        Ok(RemRc::from_slot(self.inner.alloc_object(value, SHARED)?))
    }

    /// A new variable-size object holding a copy of `values` (at most
    /// [`crate::MAX_OBJECT_BYTES`] bytes: [`RuntimeError::TooLarge`] beyond).
    pub fn alloc_slice<T: Remotable + Copy>(&self, values: &[T]) -> Result<RemSlice<T>, RuntimeError> {
        RemSlice::alloc(&self.inner, values.len(), |i| values[i])
    }

    /// A new variable-size object of `len` copies of `value` (see
    /// [`Runtime::alloc_slice`]).
    pub fn alloc_slice_filled<T: Remotable + Copy>(&self, len: usize, value: T) -> Result<RemSlice<T>, RuntimeError> {
        RemSlice::alloc(&self.inner, len, |_| value)
    }

    /// A new variable-size object of `len` values, value `i` being `f(i)`
    /// (see [`Runtime::alloc_slice`]).
    pub fn alloc_slice_with<T: Remotable + Copy>(
        &self,
        len: usize,
        f: impl FnMut(usize) -> T,
    ) -> Result<RemSlice<T>, RuntimeError> {
        RemSlice::alloc(&self.inner, len, f)
    }

    /// A census of the local spans: how many are hot, cold, kept, pinned or
    /// listed with holes, and how full (see [`LocalCensus`]). It walks every
    /// local span under the registry's lock: a diagnostic, not a counter.
    pub fn local_census(&self) -> LocalCensus {
        self.inner.heap.census()
    }

    /// Counters and levels.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// The scheme's name.
    pub fn scheme(&self) -> &'static str {
        self.inner.scheme.name()
    }

    /// Pauses (`true`) or resumes (`false`) the background work that only
    /// reorganises memory: filtering rounds and the scheme's compaction.
    /// Returns once no fold and no filtering round is in flight (called
    /// inside a [`DerefScope`], it does not wait for a filtering round,
    /// whose grace period would wait for that scope). Eviction, swap-ins,
    /// frees, failure detection and
    /// recovery go on, so nothing waits on a paused runtime, but swap-ins
    /// leave holes that are not reclaimed until it resumes.
    ///
    /// For quiescing a runtime while another one on the same machine is
    /// measured or latency-critical: `remora bench micro` alternates
    /// runtimes this way so their background work never overlaps.
    pub fn pause_background(&self, paused: bool) {
        let gate = &self.inner.filtering_gate;
        if !paused {
            gate.resume();
        } else if self.inner.rcu.in_scope() {
            gate.close();
        } else {
            gate.pause();
        }
        self.inner.scheme.pause(paused);
    }

    /// Changes the local memory budget.
    pub fn set_local_budget(&self, bytes: usize) {
        self.inner.budget.store(bytes as u64, StdOrdering::Relaxed);
        self.inner.kick();
        self.inner.wake_room();
    }

    /// Waits until local memory is below the low watermark and no eviction
    /// round (nor filtering round holding pinned spans) is under way (or
    /// `timeout`), then gives back the kept far copies of spans that went
    /// away.
    pub fn wait_for_eviction(&self, timeout: Duration) -> Result<(), RuntimeError> {
        let start = Instant::now();
        self.inner.wait_below(self.inner.low_bytes(), timeout)?;
        while self.inner.rounds.load(StdOrdering::Acquire) > 0 {
            if start.elapsed() > timeout {
                return Err(RuntimeError::EvictionStalled(timeout));
            }
            thread::sleep(Duration::from_millis(1));
        }
        self.inner.sweep_kept();
        Ok(())
    }

    /// Gives regions that hold nothing back to the manager now (keeping one
    /// spare group); returns the bytes given back. The runtime also does this
    /// by itself every second.
    pub fn give_back_empty_regions(&self) -> u64 {
        self.inner.give_back_empty()
    }

    /// The far-memory regions this runtime holds now, by region-table index
    /// (for tools and fault-injection tests).
    pub fn regions(&self) -> Vec<(u16, remora_proto::RegionGrant)> {
        self.inner.far.regions().held()
    }

    /// The memory nodes of each stripe group in use, by address: a group
    /// loses data only when more than m of them are lost before it is
    /// rebuilt. For fault-injection tools that must stay within the code's
    /// tolerance (`remora chaos`).
    pub fn stripe_groups(&self) -> Vec<Vec<String>> {
        let far = &self.inner.far;
        self.inner
            .scheme
            .stripe_groups()
            .into_iter()
            .map(|g| g.into_iter().map(|r| far.regions().get(r).grant.addr.clone()).collect())
            .collect()
    }

    /// The regions that hold far data now (spans, parity, holes or kept
    /// copies), fullest first; an empty region kept as a spare is not among
    /// them. For fault-injection tests that must hit the data.
    pub fn regions_with_data(&self) -> Vec<(u16, remora_proto::RegionGrant)> {
        let far = &self.inner.far;
        let mut v: Vec<_> = far
            .regions()
            .held()
            .into_iter()
            .map(|(i, g)| (far.pages().usage(i).0, i, g))
            .filter(|(used, ..)| *used > 0)
            .collect();
        v.sort_by_key(|(used, i, _)| (std::cmp::Reverse(*used), *i));
        v.into_iter().map(|(_, i, g)| (i, g)).collect()
    }

    /// This compute node's id at the manager.
    pub fn compute_id(&self) -> remora_proto::ComputeId {
        self.inner.far.backend().id()
    }
}

/// How long a runtime's drop waits for the confirm thread before leaving
/// it to finish on its own.
const CONFIRM_JOIN: Duration = Duration::from_millis(50);

impl Drop for Runtime {
    fn drop(&mut self) {
        // Every wait on far memory (placement waiting for capacity, a
        // rebuild waiting for a replacement, read retries) looks at
        // `far.is_stopping()`, so the joins below are prompt even while the
        // cluster is degraded.
        self.inner.stop.store(true, StdOrdering::Release);
        self.inner.far.stop();
        {
            let _k = self.inner.kick.lock().unwrap_or_else(|p| p.into_inner());
            self.inner.kicked.notify_all();
        }
        self.inner.room.wake_all();
        self.inner.far.detector().suspects.wake();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.inner.scheme.stop();
        // A verdict call to a manager that hangs lasts its own timeout.
        // The confirm thread holds no strong reference to the runtime
        // while it waits and returns when the call does, so it is left to
        // finish rather than waited for.
        if let Some(t) = self.confirm.take() {
            let deadline = Instant::now() + CONFIRM_JOIN;
            while !t.is_finished() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// The object header (reverse reference) at `addr`, viewed atomically: the
/// evictor reads it while its owner may be freeing the object.
///
/// # Safety
/// `addr` must be the 8-aligned start of an object slot in a live local span.
unsafe fn header(addr: usize) -> &'static std::sync::atomic::AtomicU64 {
    // SAFETY: per the contract the address is valid, aligned, and spans are
    // never unmapped while the heap lives.
    unsafe { &*(addr as *const std::sync::atomic::AtomicU64) }
}

fn slot_ref<'a>(s: NonNull<Slot>) -> &'a Slot {
    // SAFETY: slots live in chunks owned by the runtime, freed only when the
    // runtime's state is dropped, after every object.
    unsafe { s.as_ref() }
}

impl Inner {
    /// Wakes the eviction threads if any sleeps: one atomic load otherwise,
    /// so the swap-in path can call it freely.
    fn kick(&self) {
        if self.idle_evictors.load(StdOrdering::SeqCst) > 0 {
            let _k = self.kick.lock().unwrap_or_else(|p| p.into_inner());
            self.kicked.notify_all();
        }
    }

    /// Wakes the application threads whose room now exists.
    fn wake_room(&self) {
        self.room.wake(self.heap.bytes_in_use() as u64);
    }

    fn budget(&self) -> u64 {
        self.budget.load(StdOrdering::Relaxed)
    }

    fn high_bytes(&self) -> u64 {
        (self.budget() as f64 * self.high) as u64
    }

    /// A scope on this thread, without the wait for room `Runtime::scope`
    /// may do first.
    pub(super) fn bare_scope(&self) -> DerefScope<'_> {
        DerefScope {
            inner: self,
            guard: self.rcu.enter(),
            handed: std::cell::Cell::new(false),
        }
    }

    fn low_bytes(&self) -> u64 {
        (self.budget() as f64 * self.low) as u64
    }

    fn alloc_object<T: Remotable>(self: &Arc<Self>, value: T, flags: u64) -> Result<NonNull<Slot>, RuntimeError> {
        const {
            assert!(
                std::mem::align_of::<T>() <= 8,
                "remotable objects are at most 8-aligned"
            )
        };
        self.alloc_raw(HEADER + std::mem::size_of::<T>(), flags, |payload| {
            // SAFETY: `payload` is 8-aligned with room for a `T`, fresh and
            // seen by no one else (`alloc_raw`'s contract).
            unsafe { (payload as *mut T).write(value) }
        })
    }

    /// Allocates an object of `size` bytes (header included) owned by a new
    /// slot with `flags`, and runs `init` on the address of its payload
    /// (just past the header), which is 8-aligned, `size - HEADER` bytes
    /// long and visible to no other thread until `init` returns.
    pub(crate) fn alloc_raw(
        self: &Arc<Self>,
        size: usize,
        flags: u64,
        init: impl FnOnce(usize),
    ) -> Result<NonNull<Slot>, RuntimeError> {
        let used = self.heap.bytes_in_use() as u64;
        if used >= self.high_bytes() {
            self.kick();
            // Waiting inside a scope could deadlock with the evictor's grace
            // period, so there the budget is a soft limit.
            if used >= self.budget() && !self.rcu.in_scope() {
                self.wait_below(self.budget().saturating_sub(size as u64), self.patience)?;
            }
        }
        let slot = self.slots.alloc(0);
        let hot = self.policy.on_access();
        let res = self.heap.alloc_with(size, |addr| {
            // SAFETY: `addr` is a fresh slot of `size` bytes in a local span,
            // reserved for us under the class lock; nothing else can see it.
            unsafe {
                header(addr).store(slot.as_ptr() as u64, StdOrdering::Release);
            }
            init(addr + HEADER);
            slot_ref(slot)
                .word
                .store(local_word(addr, flags | DIRTY, hot), Ordering::Release);
        });
        match res {
            Ok(()) => {
                // Each live object keeps the runtime's state alive.
                std::mem::forget(Arc::clone(self));
                Ok(slot)
            }
            Err(e) => {
                self.slots.free(slot);
                Err(e)
            }
        }
    }
}
