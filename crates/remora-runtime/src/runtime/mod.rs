//! The runtime handle and the operations that tie the modules together:
//! dereference (fast and slow path), allocation, free, swap-in and eviction.
//! The pointer protocol these follow is written down in [`crate::pointer`].

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering as StdOrdering;
use std::thread;
use std::time::{Duration, Instant};

mod access;
mod background;
mod config;
mod counters;
mod evictor;
mod filtering;
mod free;
mod kept;
mod lifecycle;
mod pressure;
mod room;
pub(crate) mod stats;
mod swap_in;

use self::background::{confirm_loop, eviction_loop, notice_loop};
pub use self::config::{RuntimeConfig, Tuning};
use self::counters::Counters;
use self::filtering::Filtering;
use self::kept::KeptTable;
use self::lifecycle::Lifecycle;
use self::pressure::Pressure;
use self::room::Room;
pub use self::stats::Stats;

#[cfg(feature = "internals")]
use crate::census::LocalCensus;
use crate::error::RuntimeError;
use crate::eviction::EvictionPolicy;
use crate::far_memory::FarMemory;
use crate::far_page_map::FarPageMap;
use crate::loom::Ordering;
use crate::object::{HEADER, RemBox, RemRc, Remotable};
use crate::object_heap::ObjectHeap;
use crate::pointer::{DIRTY, SHARED, Slot, local_word};
use crate::scheme::Scheme;
use crate::scope::{Rcu, ScopeGuard};
use crate::slice::RemSlice;
use crate::slots::SlotTable;

/// Shared state of a runtime; kept alive by the handle and by every live object.
///
/// The shared core (the scope, slots, heap, far memory and its map, scheme
/// and policy) is used by every path; the rest is in parts that own their
/// fields: [`Pressure`] (budget, watermarks and the eviction threads),
/// [`Filtering`] (the filtering threads' hand-off), [`Lifecycle`], the
/// [`Room`] waiters, the [`KeptTable`] and the [`Counters`].
pub(crate) struct Inner {
    rcu: Rcu,
    slots: SlotTable,
    heap: ObjectHeap,
    far: Arc<FarMemory>,
    far_map: FarPageMap,
    scheme: Box<dyn Scheme>,
    policy: Arc<dyn EvictionPolicy>,
    /// How long an allocation outside a scope waits for eviction.
    patience: Duration,
    counters: Counters,
    /// Budget, watermarks, and waking the eviction threads.
    pressure: Pressure,
    lifecycle: Lifecycle,
    /// Application threads waiting for local room.
    room: Room,
    /// Kept far copies of swapped-in clean spans.
    kept: KeptTable,
    /// What the filtering threads share with the rest of the runtime.
    filtering: Filtering,
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
            patience: cfg.patience,
            counters: Counters::default(),
            pressure: Pressure::new(
                cfg.local_budget,
                cfg.tuning.high_watermark,
                cfg.tuning.low_watermark,
                cfg.tuning.eviction_batch,
            ),
            lifecycle: Lifecycle::default(),
            room: Room::default(),
            kept: KeptTable::default(),
            filtering: Filtering::new(cfg.tuning.filtering_threads, cfg.tuning.object_swap_in),
        });
        if let Err(e) = inner.scheme.start(&inner.far) {
            inner.scheme.stop();
            return Err(e);
        }
        let mut threads = Vec::new();
        for i in 0..cfg.tuning.eviction_threads.max(1) {
            let weak = Arc::downgrade(&inner);
            threads.push(
                thread::Builder::new()
                    .name(format!("remora-evict-{i}"))
                    .spawn(move || eviction_loop(&weak))
                    .map_err(|e| RuntimeError::LocalMemory(format!("cannot spawn eviction thread: {e}")))?,
            );
        }
        for i in 0..cfg.tuning.filtering_threads {
            let weak = Arc::downgrade(&inner);
            let interval = cfg.tuning.filter_interval;
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
        if inner.heap.bytes_in_use() as u64 > inner.pressure.budget()
            && !inner.pressure.stalled()
            && !inner.rcu.in_scope()
        {
            inner.pressure.kick();
            if let Err(e) = inner.wait_below(inner.pressure.budget(), inner.patience) {
                // Don't make every later scope wait as long: until eviction
                // makes progress again, the budget is left soft.
                inner.pressure.stall();
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
    #[cfg(feature = "internals")]
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
    #[cfg(feature = "internals")]
    pub fn pause_background(&self, paused: bool) {
        self.inner.filtering.pause(paused, self.inner.rcu.in_scope());
        self.inner.scheme.pause(paused);
    }

    /// Changes the local memory budget.
    pub fn set_local_budget(&self, bytes: usize) {
        self.inner.pressure.set_budget(bytes);
        self.inner.pressure.kick();
        self.inner.wake_room();
    }

    /// Waits until local memory is below the low watermark and no eviction
    /// round (nor filtering round holding pinned spans) is under way (or
    /// `timeout`), then gives back the kept far copies of spans that went
    /// away.
    pub fn wait_for_eviction(&self, timeout: Duration) -> Result<(), RuntimeError> {
        let start = Instant::now();
        self.inner.wait_below(self.inner.pressure.low_bytes(), timeout)?;
        while self.inner.pressure.rounds_under_way() {
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
    #[cfg(feature = "internals")]
    pub fn regions(&self) -> Vec<(u16, remora_proto::RegionGrant)> {
        self.inner.far.regions().held()
    }

    /// The memory nodes of each stripe group in use, by address: a group
    /// loses data only when more than m of them are lost before it is
    /// rebuilt. For fault-injection tools that must stay within the code's
    /// tolerance (`remora chaos`).
    #[cfg(feature = "internals")]
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
    #[cfg(feature = "internals")]
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
        self.inner.lifecycle.stop();
        self.inner.far.stop();
        self.inner.pressure.wake_all();
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
    /// Wakes the application threads whose room now exists.
    fn wake_room(&self) {
        self.room.wake(self.heap.bytes_in_use() as u64);
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
        if used >= self.pressure.high_bytes() {
            self.pressure.kick();
            // Waiting inside a scope could deadlock with the evictor's grace
            // period, so there the budget is a soft limit.
            if used >= self.pressure.budget() && !self.rcu.in_scope() {
                self.wait_below(self.pressure.budget().saturating_sub(size as u64), self.patience)?;
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
