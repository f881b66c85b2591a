//! The runtime handle and the operations that tie the modules together:
//! dereference (fast and slow path), allocation, free, swap-in and eviction.
//! The pointer protocol these follow is written down in [`crate::pointer`].

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use remora_proto::{ComputeSession, ConnOptions};

use crate::error::RuntimeError;
use crate::eviction::{Clock, EvictionPolicy};
use crate::far_memory::FarMemory;
use crate::far_page_map::{FarPageMap, FarSpan};
use crate::loom::Ordering;
use crate::object::{HEADER, RemBox, RemRc, Remotable};
use crate::object_heap::{ObjectHeap, SpanRef};
use crate::pointer::{
    self, DIRTY, EVICTING, FAST_MASK, HOT_MASK, HOT_SHIFT, LOCK, MOVING, PRESENT, SEALED, SHARED, Slot, far_loc,
    far_word, local_addr, local_word,
};
use crate::region_table::RegionTable;
use crate::scheme::{NonFt, Scheme, SpanAddr};
use crate::scope::{Rcu, ScopeGuard};
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
    /// ...and stops below this one.
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
}

impl RuntimeConfig {
    /// Defaults for a manager at `manager` and a local budget in bytes:
    /// `non-ft`, CLOCK, one eviction thread, watermarks 95 % / 85 %.
    pub fn new(manager: impl Into<String>, local_budget: usize) -> Self {
        Self {
            manager: manager.into(),
            name: format!("remora-runtime-{}", std::process::id()),
            local_budget,
            high_watermark: 0.95,
            low_watermark: 0.85,
            scheme: Box::new(NonFt),
            policy: Box::new(Clock),
            eviction_threads: 1,
            eviction_batch: 16,
            conn: ConnOptions::default(),
            patience: Duration::from_secs(30),
        }
    }
}

/// Counters and levels, for benchmarks and tests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Spans swapped in.
    pub swap_ins: u64,
    /// Remote reads issued by swap-ins.
    pub swap_in_reads: u64,
    /// Spans swapped out.
    pub swap_outs: u64,
    /// Evictions abandoned because an application thread touched the span.
    pub evictions_aborted: u64,
    /// Bytes of whole data spans swapped out.
    pub bytes_evicted_data: u64,
    /// Bytes read from memory nodes.
    pub bytes_read_remote: u64,
    /// Bytes written to memory nodes by swap-outs.
    pub bytes_written_remote: u64,
    /// Far bytes allocated to spans now.
    pub remote_bytes_used: u64,
    /// Far bytes of live data spans now.
    pub live_bytes: u64,
    /// Local bytes in spans now.
    pub local_bytes: u64,
    /// Live objects.
    pub objects: u64,
    /// Swap-ins served by decoding from survivors.
    pub degraded_reads: u64,
    /// Bytes rebuilt on replacement regions after memory-node failures.
    pub reconstructed_bytes: u64,
    /// Seconds spent rebuilding, summed over recoveries.
    pub reconstruct_seconds: f64,
    /// Recoveries finished / under way.
    pub recoveries: u64,
    /// Recoveries under way.
    pub recovering: u64,
    /// Far bytes held by holes (swapped-in spans parity still covers).
    pub hole_bytes: u64,
    /// Far spans that failed their checksum and were rebuilt and rewritten.
    pub checksum_repairs: u64,
    /// Rebuilds retried (a rebuilt shard failed its checksum, or a node failed mid-rebuild).
    pub rebuild_retries: u64,
    /// Dereferences that waited for a swap-in, their own or another thread's (misses).
    pub deref_misses: u64,
    /// Bytes of spans swapped in.
    pub swap_in_bytes: u64,
    /// Bytes of swapped-in objects dereferenced while their span was local;
    /// swap-in amplification is `swap_in_bytes / swap_in_used_bytes`.
    pub swap_in_used_bytes: u64,
    /// Nanoseconds application threads spent waiting for local room, summed over threads.
    pub room_wait_ns: u64,
    /// Nanoseconds eviction threads spent evicting, summed over threads.
    pub evict_busy_ns: u64,
    /// Spans re-evicted without a write: clean, their far copy kept.
    pub clean_evictions: u64,
    /// Bytes not written thanks to clean re-eviction.
    pub clean_bytes_saved: u64,
    /// Far bytes held now by kept far copies of swapped-in clean spans (a level).
    pub kept_bytes: u64,
    /// Objects moved between local spans by filtering threads.
    pub objects_moved: u64,
    /// Local spans filtering emptied and freed.
    pub spans_filtered: u64,
}

#[derive(Default)]
struct Counters {
    swap_ins: AtomicU64,
    swap_in_reads: AtomicU64,
    swap_outs: AtomicU64,
    aborted: AtomicU64,
    evicted_bytes: AtomicU64,
}

/// Shared state of a runtime; kept alive by the handle and by every live object.
pub(crate) struct Inner {
    rcu: Rcu,
    slots: SlotTable,
    heap: ObjectHeap,
    far: Arc<FarMemory>,
    far_map: FarPageMap,
    scheme: Box<dyn Scheme>,
    policy: Box<dyn EvictionPolicy>,
    budget: AtomicU64,
    high: f64,
    low: f64,
    batch: usize,
    patience: Duration,
    counters: Counters,
    /// Eviction rounds under way (a round holds far pages until it commits or aborts).
    rounds: AtomicU64,
    /// The manager expired our session: far memory is gone.
    expired: AtomicBool,
    /// A wait for eviction timed out and no span has been evicted since.
    stalled: AtomicBool,
    stop: AtomicBool,
    /// Wakes eviction threads (pressure) and allocators (progress).
    kick: Mutex<u64>,
    kicked: Condvar,
}

/// A connection to far memory and the local heap: the handle applications use.
/// Dropping it stops the background threads; objects still alive keep the
/// shared state (and their far memory) until they are dropped.
pub struct Runtime {
    inner: Arc<Inner>,
    threads: Vec<thread::JoinHandle<()>>,
}

/// A deref scope of a runtime (see the `scope` module): references obtained
/// through it are valid until it is dropped. Not `Send`.
pub struct DerefScope<'rt> {
    inner: &'rt Inner,
    guard: ScopeGuard<'rt>,
}

impl DerefScope<'_> {
    pub(crate) fn inner(&self) -> &Inner {
        self.inner
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
        let session = Arc::new(ComputeSession::open(&cfg.manager, &cfg.name, cfg.conn)?);
        let events = session.take_events();
        let far = Arc::new(FarMemory::new(session, RegionTable::new(cfg.conn), cfg.patience));
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| Inner {
            rcu: Rcu::new(),
            slots: SlotTable::new(weak.as_ptr() as *const ()),
            heap: ObjectHeap::new(),
            far,
            far_map: FarPageMap::default(),
            scheme: cfg.scheme,
            policy: cfg.policy,
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
            kick: Mutex::new(0),
            kicked: Condvar::new(),
        });
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
        if let Some(events) = events {
            let weak = Arc::downgrade(&inner);
            threads.push(
                thread::Builder::new()
                    .name("remora-notices".into())
                    .spawn(move || notice_loop(&weak, &events))
                    .map_err(|e| RuntimeError::LocalMemory(format!("cannot spawn notice thread: {e}")))?,
            );
        }
        Ok(Self { inner, threads })
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
        DerefScope {
            inner: &self.inner,
            guard: self.inner.rcu.enter(),
        }
    }

    /// Places `value` in a new object owned by a unique pointer.
    pub fn alloc<T: Remotable>(&self, value: T) -> Result<RemBox<T>, RuntimeError> {
        Ok(RemBox::from_slot(self.inner.alloc_object(value, 0)?))
    }

    /// Places `value` in a new object owned by a shared pointer.
    pub fn alloc_shared<T: Remotable>(&self, value: T) -> Result<RemRc<T>, RuntimeError> {
        Ok(RemRc::from_slot(self.inner.alloc_object(value, SHARED)?))
    }

    /// Counters and levels.
    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// The scheme's name.
    pub fn scheme(&self) -> &'static str {
        self.inner.scheme.name()
    }

    /// Changes the local memory budget.
    pub fn set_local_budget(&self, bytes: usize) {
        self.inner.budget.store(bytes as u64, StdOrdering::Relaxed);
        self.inner.kick();
    }

    /// Waits until local memory is below the low watermark and no eviction
    /// round is under way (or `timeout`).
    pub fn wait_for_eviction(&self, timeout: Duration) -> Result<(), RuntimeError> {
        let start = Instant::now();
        self.inner.wait_below(self.inner.low_bytes(), timeout)?;
        while self.inner.rounds.load(StdOrdering::Acquire) > 0 {
            if start.elapsed() > timeout {
                return Err(RuntimeError::EvictionStalled(timeout));
            }
            thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// The far-memory regions this runtime holds now, by region-table index
    /// (for tools and fault-injection tests).
    pub fn regions(&self) -> Vec<(u16, remora_proto::RegionGrant)> {
        (0..self.inner.far.regions.len() as u16)
            .map(|i| (i, self.inner.far.regions.get(i).grant.clone()))
            .collect()
    }

    /// This compute node's id at the manager.
    pub fn compute_id(&self) -> remora_proto::ComputeId {
        self.inner.far.session.id()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.inner.stop.store(true, StdOrdering::Release);
        self.inner.kick();
        for t in self.threads.drain(..) {
            let _ = t.join();
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
    fn kick(&self) {
        let mut k = self.kick.lock().unwrap_or_else(|p| p.into_inner());
        *k += 1;
        self.kicked.notify_all();
    }

    fn budget(&self) -> u64 {
        self.budget.load(StdOrdering::Relaxed)
    }

    fn high_bytes(&self) -> u64 {
        (self.budget() as f64 * self.high) as u64
    }

    fn low_bytes(&self) -> u64 {
        (self.budget() as f64 * self.low) as u64
    }

    fn stats(&self) -> Stats {
        let (_, live) = self.far_map.totals();
        let t = &self.far.traffic;
        let rep = self.scheme.report();
        Stats {
            degraded_reads: rep.degraded_reads,
            reconstructed_bytes: rep.reconstructed_bytes,
            reconstruct_seconds: rep.reconstruct_time.as_secs_f64(),
            recoveries: rep.recoveries,
            recovering: rep.recovering,
            hole_bytes: rep.hole_bytes,
            checksum_repairs: rep.repairs,
            rebuild_retries: rep.rebuild_retries,
            swap_ins: self.counters.swap_ins.load(StdOrdering::Relaxed),
            swap_in_reads: self.counters.swap_in_reads.load(StdOrdering::Relaxed),
            swap_outs: self.counters.swap_outs.load(StdOrdering::Relaxed),
            evictions_aborted: self.counters.aborted.load(StdOrdering::Relaxed),
            bytes_evicted_data: self.counters.evicted_bytes.load(StdOrdering::Relaxed),
            bytes_read_remote: t.bytes_read.load(StdOrdering::Relaxed),
            bytes_written_remote: t.bytes_written.load(StdOrdering::Relaxed),
            remote_bytes_used: self.scheme.remote_bytes_used(&self.far),
            live_bytes: live,
            local_bytes: self.heap.bytes_in_use() as u64,
            objects: self.slots.in_use() as u64,
            ..Stats::default()
        }
    }

    /// Blocks (outside scopes only) until local usage is at most `target`.
    fn wait_below(&self, target: u64, timeout: Duration) -> Result<(), RuntimeError> {
        let start = Instant::now();
        let mut last_progress = (self.heap.bytes_in_use(), Instant::now());
        loop {
            let used = self.heap.bytes_in_use();
            if used as u64 <= target {
                return Ok(());
            }
            if self.stop.load(StdOrdering::Acquire) {
                return Err(RuntimeError::Shutdown);
            }
            if used < last_progress.0 {
                last_progress = (used, Instant::now());
            }
            if start.elapsed() > timeout && last_progress.1.elapsed() > Duration::from_millis(500) {
                return Err(RuntimeError::EvictionStalled(timeout));
            }
            let k = self.kick.lock().unwrap_or_else(|p| p.into_inner());
            self.kicked.notify_all();
            let _ = self.kicked.wait_timeout(k, Duration::from_millis(5));
        }
    }

    fn alloc_object<T: Remotable>(self: &Arc<Self>, value: T, flags: u64) -> Result<NonNull<Slot>, RuntimeError> {
        const {
            assert!(
                std::mem::align_of::<T>() <= 8,
                "remotable objects are at most 8-aligned"
            )
        };
        let size = HEADER + std::mem::size_of::<T>();
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
                ((addr + HEADER) as *mut T).write(value);
            }
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

    /// Resolves a pointer to its object's header address, swapping the span
    /// in if needed. Must be called inside a deref scope of this runtime.
    #[inline]
    pub(crate) fn access(&self, slot: NonNull<Slot>, write: bool) -> Result<usize, RuntimeError> {
        let s = slot_ref(slot);
        let w = s.word.load(Ordering::Acquire);
        if w & FAST_MASK == PRESENT {
            self.touch(s, w, write);
            return Ok(local_addr(w));
        }
        self.access_slow(s, write)
    }

    /// The read/write barrier: raises hotness (and dirty on a write) only if
    /// not already set, so a hot object costs no atomic write per access.
    #[inline]
    fn touch(&self, s: &Slot, w: u64, write: bool) {
        let want = if write { HOT_MASK | DIRTY } else { HOT_MASK };
        if w & want != want {
            s.word.fetch_or(
                ((self.policy.on_access() as u64) << HOT_SHIFT) | (want & DIRTY),
                Ordering::Relaxed,
            );
        }
    }

    #[cold]
    fn access_slow(&self, s: &Slot, write: bool) -> Result<usize, RuntimeError> {
        loop {
            let w = s.word.load(Ordering::Acquire);
            if w & LOCK != 0 {
                crate::loom::spin_yield();
                continue;
            }
            if w & PRESENT == 0 {
                if let Err(e) = self.swap_in(far_loc(w)) {
                    return Err(if self.expired.load(StdOrdering::Acquire) {
                        RuntimeError::SessionExpired
                    } else {
                        e
                    });
                }
                continue;
            }
            if w & SEALED != 0 {
                // The evictor is past its grace period: wait for its verdict.
                crate::loom::spin_yield();
                continue;
            }
            if w & (EVICTING | MOVING) != 0 {
                // Race the background thread for the lock; winning aborts its operation.
                if s.try_lock_exact(w) {
                    let hot = (self.policy.on_access() as u64) << HOT_SHIFT;
                    let dirty = if write { DIRTY } else { 0 };
                    s.unlock_with((w & !(EVICTING | MOVING | HOT_MASK)) | hot | dirty);
                    return Ok(local_addr(w));
                }
                continue;
            }
            self.touch(s, w, write);
            return Ok(local_addr(w));
        }
    }

    /// Brings the far span holding `loc` back with one remote read and fixes
    /// the words of its live objects.
    fn swap_in(&self, loc: pointer::FarLoc) -> Result<(), RuntimeError> {
        let Some(fs) = self.far_map.get(loc.region, loc.page) else {
            return Ok(()); // already swapped in by another thread
        };
        let mut st = fs.lock();
        if st.gone {
            return Ok(());
        }
        let span = self.heap.new_span(fs.class, fs.pages as usize)?;
        // SAFETY: the span was just allocated for us and is not yet visible
        // to anyone; its memory is `bytes()` long and mapped.
        let dest = unsafe { std::slice::from_raw_parts_mut(span.get().start() as *mut u8, span.get().bytes()) };
        let at = SpanAddr {
            region: fs.region,
            page: fs.page,
        };
        let mut reads = match self.scheme.swap_in(&self.far, at, dest) {
            Ok(r) => r,
            Err(e) => {
                self.heap.discard_span(span);
                return Err(e);
            }
        };
        if checksum(dest) != fs.checksum {
            // A corrupt far copy is handled like a lost one: rebuild it from
            // redundancy, then write the good bytes back so the redundancy
            // that covers it stays consistent.
            tracing::warn!("span r{}:p{} failed its checksum; rebuilding it", fs.region, fs.page);
            let rebuilt = self.scheme.degraded_read(&self.far, at, dest);
            match rebuilt {
                Ok(r) if checksum(dest) == fs.checksum => {
                    reads += r;
                    if let Err(e) = self.scheme.repair(&self.far, at, dest) {
                        tracing::warn!("could not rewrite repaired span r{}:p{}: {e}", fs.region, fs.page);
                    }
                }
                other => {
                    self.heap.discard_span(span);
                    return Err(match other {
                        Err(e) => e,
                        Ok(_) => RuntimeError::DataLost(format!(
                            "span r{}:p{} failed its checksum and so did its reconstruction",
                            fs.region, fs.page
                        )),
                    });
                }
            }
        }
        let live: Vec<usize> = (0..fs.capacity as usize)
            .filter(|&i| st.live[i / 64] & (1 << (i % 64)) != 0)
            .collect();
        self.heap.adopt_span(span, &live, |sp| {
            for &i in &live {
                let addr = sp.object_addr(i);
                // SAFETY: slot i of the new span holds the object's bytes as evicted.
                let slot = unsafe { header(addr) }.load(StdOrdering::Acquire) as *const Slot;
                // SAFETY: a live object's header names its slot, which lives while the object does.
                let s = unsafe { &*slot };
                let expect = fs.loc(i as u16);
                loop {
                    let w = s.word.load(Ordering::Acquire);
                    debug_assert!(w & PRESENT == 0 && far_loc(w) == expect, "far word mismatch");
                    let new = local_word(addr, w & SHARED, pointer::hotness(w));
                    if s.word
                        .compare_exchange(w, new, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
            }
        });
        st.gone = true;
        self.far_map.remove(fs.region, fs.page);
        self.scheme.release(&self.far, at, fs.pages);
        self.counters.swap_ins.fetch_add(1, StdOrdering::Relaxed);
        self.counters
            .swap_in_reads
            .fetch_add(reads as u64, StdOrdering::Relaxed);
        drop(st);
        if self.heap.bytes_in_use() as u64 >= self.high_bytes() {
            self.kick();
        }
        Ok(())
    }

    /// Frees the object owned by `slot` (dropping its value first if `T`
    /// needs it) and the slot.
    ///
    /// Frees nested in another free on the same thread (a value's fields
    /// dropping their own pointers) are queued and run by the outermost one,
    /// so dropping a long linked structure uses constant stack.
    ///
    /// # Safety
    /// `slot` comes from a runtime's slot table and its last owner is giving it up.
    pub(crate) unsafe fn free_object<T: Remotable>(slot: NonNull<Slot>) {
        type Pending = (NonNull<Slot>, unsafe fn(NonNull<Slot>));
        thread_local! {
            static PENDING: std::cell::RefCell<Option<Vec<Pending>>> = const { std::cell::RefCell::new(None) };
        }
        let nested = PENDING.with(|p| {
            let mut p = p.borrow_mut();
            match p.as_mut() {
                Some(q) => {
                    q.push((slot, Self::free_one::<T>));
                    true
                }
                None => {
                    *p = Some(Vec::new());
                    false
                }
            }
        });
        if nested {
            return;
        }
        // SAFETY: forwarded from our caller.
        unsafe { Self::free_one::<T>(slot) };
        while let Some((s, f)) = PENDING.with(|p| p.borrow_mut().as_mut().and_then(Vec::pop)) {
            // SAFETY: queued by a nested call under the same contract.
            unsafe { f(s) };
        }
        PENDING.with(|p| *p.borrow_mut() = None);
    }

    /// Frees one object (see [`Inner::free_object`]).
    ///
    /// # Safety
    /// As [`Inner::free_object`].
    unsafe fn free_one<T: Remotable>(slot: NonNull<Slot>) {
        // SAFETY: per the contract, the slot's chunk is live and names its runtime.
        let inner = unsafe { &*(owner_of(slot) as *const Inner) };
        let s = slot_ref(slot);
        let mut value: Option<T> = None;
        loop {
            let w = s.word.load(Ordering::Acquire);
            if w & LOCK != 0 {
                crate::loom::spin_yield();
                continue;
            }
            if w & PRESENT != 0 {
                if !s.try_lock_exact(w) {
                    continue;
                }
                // We hold L on a present object: no one can move it now; a
                // pending eviction of its span will see the slot change and abort.
                let addr = local_addr(w);
                if std::mem::needs_drop::<T>() {
                    // SAFETY: the object is live and local; we read it out exactly once.
                    value = Some(unsafe { ((addr + HEADER) as *const T).read() });
                }
                // SAFETY: the header of a live local object.
                unsafe { header(addr) }.store(0, StdOrdering::Release);
                inner.heap.free(addr);
                break;
            }
            if std::mem::needs_drop::<T>() {
                // Its drop glue must run on the real bytes: bring it back first.
                if let Err(e) = inner.swap_in(far_loc(w)) {
                    tracing::error!("leaking an unreadable far object on drop: {e}");
                    break;
                }
                continue;
            }
            let loc = far_loc(w);
            let Some(fs) = inner.far_map.get(loc.region, loc.page) else {
                continue; // swapped in meanwhile; retry as local
            };
            let mut st = fs.lock();
            if st.gone || s.word.load(Ordering::Acquire) != w {
                continue;
            }
            let i = loc.object as usize;
            st.live[i / 64] &= !(1 << (i % 64));
            st.live_count -= 1;
            if st.live_count == 0 {
                st.gone = true;
                inner.far_map.remove(fs.region, fs.page);
                let at = SpanAddr {
                    region: fs.region,
                    page: fs.page,
                };
                inner.scheme.release(&inner.far, at, fs.pages);
            }
            break;
        }
        inner.slots.free(slot);
        drop(value);
        // SAFETY: balances the count taken when the object was allocated.
        unsafe { Arc::decrement_strong_count(inner as *const Inner) };
    }

    /// One round of eviction: pick cold spans and swap them out.
    fn evict_round(&self) -> usize {
        self.rounds.fetch_add(1, StdOrdering::AcqRel);
        let n = self.evict_round_inner();
        self.rounds.fetch_sub(1, StdOrdering::AcqRel);
        n
    }

    fn evict_round_inner(&self) -> usize {
        let candidates = self.heap.pick_cold(&*self.policy, self.batch);
        if candidates.is_empty() {
            return 0;
        }
        // Phase 1: mark E on every object of each span.
        let mut marked: Vec<(SpanRef, Marked)> = Vec::new();
        for span in candidates {
            if !self.heap.begin_evict(span) {
                continue;
            }
            match self.mark_span(span) {
                Some(objs) => marked.push((span, objs)),
                None => {
                    self.counters.aborted.fetch_add(1, StdOrdering::Relaxed);
                    self.heap.end_evict(span, false);
                }
            }
        }
        if marked.is_empty() {
            return 0;
        }
        // Phase 2: one grace period for the whole batch, then seal: from here
        // on an access waits for the eviction instead of abandoning it.
        self.rcu.synchronize();
        let mut sealed: Vec<(SpanRef, Marked)> = Vec::with_capacity(marked.len());
        for (span, mut objs) in marked {
            let mut ok = true;
            for (slot, exp, _) in objs.iter_mut() {
                match transition(slot_ref(*slot), local_addr(*exp), PRESENT | EVICTING, SEALED) {
                    Some(w) => *exp = w,
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                sealed.push((span, objs));
            } else {
                unmark(&objs);
                self.counters.aborted.fetch_add(1, StdOrdering::Relaxed);
                self.heap.end_evict(span, false);
            }
        }
        let marked = sealed;
        if marked.is_empty() {
            return 0;
        }
        // Phase 3: write the spans out; nothing local is released yet.
        let bufs: Vec<&[u8]> = marked
            .iter()
            .map(|(span, _)| {
                // SAFETY: the span is local and pinned by begin_evict. Its bytes
                // may change only if an application thread aborts the eviction
                // by clearing E, and then this copy is discarded in phase 4.
                unsafe { std::slice::from_raw_parts(span.get().start() as *const u8, span.get().bytes()) }
            })
            .collect();
        let sums: Vec<u64> = bufs.iter().map(|b| checksum(b)).collect();
        let placed = match self.scheme.swap_out(&self.far, &bufs, &sums) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("swap-out of {} spans failed: {e}", marked.len());
                for (span, objs) in marked {
                    unmark(&objs);
                    self.heap.end_evict(span, false);
                }
                return 0;
            }
        };
        // Phase 4: commit each span, or abort it if its owner freed an object meanwhile.
        let mut evicted = 0;
        for (((span, mut objs), at), sum) in marked.into_iter().zip(placed).zip(sums) {
            let sp = span.get();
            let mut locked = 0;
            for (slot, exp, _) in objs.iter_mut() {
                match transition(slot_ref(*slot), local_addr(*exp), PRESENT | EVICTING | SEALED, LOCK) {
                    Some(w) => *exp = w & !LOCK,
                    None => break,
                }
                locked += 1;
            }
            if locked < objs.len() {
                // The owner freed an object meanwhile: keep the span local.
                for (slot, exp, _) in &objs[..locked] {
                    slot_ref(*slot).unlock_with(exp & !(EVICTING | SEALED));
                }
                unmark(&objs[locked..]);
                self.scheme.release(&self.far, at, sp.pages() as u32);
                self.counters.aborted.fetch_add(1, StdOrdering::Relaxed);
                self.heap.end_evict(span, false);
                continue;
            }
            let mut live = vec![0u64; sp.capacity().div_ceil(64)];
            for (_, _, i) in &objs {
                live[i / 64] |= 1 << (i % 64);
            }
            let fs = Arc::new(FarSpan::new(
                at.region,
                at.page,
                sp.pages() as u32,
                self.heap.class_code(sp),
                sp.capacity() as u32,
                live,
                sum,
            ));
            // Published before the words, so whoever sees a far word finds it.
            self.far_map.insert(Arc::clone(&fs));
            for (slot, exp, i) in &objs {
                let loc = fs.loc(*i as u16);
                slot_ref(*slot).unlock_with(far_word(loc, *exp, pointer::hotness(*exp)));
            }
            self.counters.swap_outs.fetch_add(1, StdOrdering::Relaxed);
            self.counters
                .evicted_bytes
                .fetch_add(sp.bytes() as u64, StdOrdering::Relaxed);
            self.heap.end_evict(span, true);
            evicted += 1;
        }
        evicted
    }

    /// Sets E on every live object of `span`; `None` (and nothing marked) if
    /// an object is busy or being freed.
    fn mark_span(&self, span: SpanRef) -> Option<Marked> {
        let sp = span.get();
        let mut objs = Vec::with_capacity(sp.allocated());
        for i in 0..sp.capacity() {
            if !sp.is_allocated(i) {
                continue;
            }
            let addr = sp.object_addr(i);
            // SAFETY: slot i is allocated in a pinned local span.
            let h = unsafe { header(addr) }.load(StdOrdering::Acquire);
            let ok = NonNull::new(h as *mut Slot).and_then(|slot| {
                let prev = slot_ref(slot).word.fetch_or(EVICTING, Ordering::SeqCst);
                if prev & (PRESENT | LOCK | MOVING | EVICTING) == PRESENT && local_addr(prev) == addr {
                    Some((slot, prev | EVICTING, i))
                } else {
                    if prev & EVICTING == 0 {
                        slot_ref(slot).word.fetch_and(!EVICTING, Ordering::SeqCst);
                    }
                    None
                }
            });
            match ok {
                Some(o) => objs.push(o),
                None => {
                    unmark(&objs);
                    return None;
                }
            }
        }
        Some(objs)
    }
}

/// The objects of a span marked for eviction: slot, word as marked, index.
type Marked = Vec<(NonNull<Slot>, u64, usize)>;

/// Sets `add` on the word of the local object at `addr` if it has exactly
/// the flags `need` among P, L, E, Z (M must be clear), whatever its hotness
/// and dirty bits say. Returns the new word, or `None` if the word no longer
/// qualifies (the object was freed, moved, or an access aborted the mark).
fn transition(s: &Slot, addr: usize, need: u64, add: u64) -> Option<u64> {
    const FLAGS: u64 = PRESENT | LOCK | MOVING | EVICTING | SEALED;
    loop {
        let w = s.word.load(Ordering::Acquire);
        if w & FLAGS != need || local_addr(w) != addr {
            return None;
        }
        if s.word
            .compare_exchange(w, w | add, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Some(w | add);
        }
    }
}

/// Takes back our marks (E and Z) from words that still name the objects we
/// marked, whatever happened to their hotness or dirty bits meanwhile. A
/// word that is locked, freed or already unmarked is left to its holder.
fn unmark(objs: &[(NonNull<Slot>, u64, usize)]) {
    for (slot, exp, _) in objs {
        let s = slot_ref(*slot);
        let addr = local_addr(*exp);
        loop {
            let w = s.word.load(Ordering::Acquire);
            if w & PRESENT == 0 || w & LOCK != 0 || w & EVICTING == 0 || local_addr(w) != addr {
                break;
            }
            let clean = w & !(EVICTING | SEALED);
            if s.word
                .compare_exchange(w, clean, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                break;
            }
        }
    }
}

/// Turns the manager's notices into recovery.
fn notice_loop(weak: &std::sync::Weak<Inner>, events: &std::sync::mpsc::Receiver<remora_proto::SessionEvent>) {
    loop {
        let ev = match events.recv_timeout(Duration::from_millis(100)) {
            Ok(ev) => ev,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => match weak.upgrade() {
                Some(inner) if !inner.stop.load(StdOrdering::Acquire) => continue,
                _ => return,
            },
            Err(_) => return,
        };
        let Some(inner) = weak.upgrade() else { return };
        match ev {
            remora_proto::SessionEvent::Manager(e) => match e.kind {
                remora_proto::EventKind::NodeDead { node, addr, regions } => {
                    tracing::warn!(
                        "memory node {node} at {addr} died, holding {} of our regions",
                        regions.len()
                    );
                    inner.scheme.node_failed(&inner.far, node);
                }
                remora_proto::EventKind::NodeDraining { node, addr, .. } => {
                    tracing::info!("memory node {node} at {addr} is draining");
                }
            },
            remora_proto::SessionEvent::Resync => tracing::info!("manager restarted"),
            remora_proto::SessionEvent::Expired => {
                inner.expired.store(true, StdOrdering::Release);
                tracing::error!("the manager declared this compute node dead: far memory is gone")
            }
        }
    }
}

fn eviction_loop(weak: &std::sync::Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        if inner.stop.load(StdOrdering::Acquire) {
            return;
        }
        let used = inner.heap.bytes_in_use() as u64;
        if used > inner.high_bytes() {
            let mut stuck = 0;
            while (inner.heap.bytes_in_use() as u64) > inner.low_bytes() && !inner.stop.load(StdOrdering::Acquire) {
                let n = inner.evict_round();
                if n > 0 {
                    inner.stalled.store(false, StdOrdering::Release);
                }
                inner.kick();
                if n == 0 {
                    stuck += 1;
                    if stuck > 3 {
                        break;
                    }
                    thread::sleep(Duration::from_millis(1));
                } else {
                    stuck = 0;
                }
            }
        }
        let k = inner.kick.lock().unwrap_or_else(|p| p.into_inner());
        let _ = inner.kicked.wait_timeout(k, Duration::from_millis(10));
    }
}
