//! fork() with remote arrays: the child reads them as they were at the fork, copy-on-write,
//! with a pager of its own, as under `rmem run` (librmem's fork.rs; ARCHITECTURE.md, fork).
//! multiprocessing's `fork` start method (the default up to Python 3.13) hands a pool's
//! workers remote arrays this way.
//!
//! Three atfork handlers, registered when the module is loaded: prepare parks the pager of
//! every session this process serves ([`Runtime::prepare_fork`]: a snapshot on the servers,
//! the region inheritable); parent lets them go on; the child takes each over with a runtime
//! of its own, which replaces the parent's in the child's copy of the session (the parent's
//! copy is forgotten, never dropped: its pager is not in the child). A session whose child
//! half cannot start (it says why on stderr) keeps its range reserved with no access in the
//! child, and a touch there ends the child with status 70 and a message (signals.rs), never
//! zeros; its calls raise `RmemError`. The servers a session started stay its parent's.

use crate::{signals, Session};
use rmem_client::runtime::Forking;
use std::cell::RefCell;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};

/// Every session started in this process, alive or not.
static SESSIONS: Mutex<Vec<Weak<Session>>> = Mutex::new(Vec::new());

/// A session's fork in progress: prepared, or why not. `forking` borrows the session's
/// runtime, which `session` keeps alive; it is consumed before `session` is let go.
struct Pending {
    forking: Result<Forking<'static>, String>,
    session: Arc<Session>,
}

thread_local! {
    static PENDING: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
}

/// Register the handlers (once, when the module is loaded).
pub fn install() {
    // SAFETY: registering plain extern "C" fns without state.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Follow `session` into fork() children.
pub fn track(session: &Arc<Session>) {
    let mut all = SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(session));
}

extern "C" fn prepare() {
    let me = signals::getpid();
    let live: Vec<Arc<Session>> = SESSIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.pid() == me && s.lost.get().is_none())
        .collect();
    let pending = live
        .into_iter()
        .map(|session| {
            // SAFETY: the runtime outlives the Forking: `session` holds it and is dropped
            // only after the Forking is consumed (parent, child).
            let rt: &'static rmem_client::Runtime = unsafe { &*(session.rt() as *const _) };
            let forking = rt.prepare_fork().map_err(|e| rmem_client::error_chain(&e));
            Pending { forking, session }
        })
        .collect();
    PENDING.with(|p| *p.borrow_mut() = pending);
}

extern "C" fn parent() {
    for Pending { forking, session } in PENDING.with(|p| std::mem::take(&mut *p.borrow_mut())) {
        if let Ok(f) = forking {
            f.parent();
        }
        drop(session);
    }
}

extern "C" fn child() {
    let me = signals::getpid();
    for Pending { forking, session } in PENDING.with(|p| std::mem::take(&mut *p.borrow_mut())) {
        let started = forking.and_then(|f| {
            f.child(Box::new(|| {}))
                .map_err(|e| rmem_client::error_chain(&e))
        });
        match started {
            Ok(rt) => {
                // SAFETY: this child has one thread, this one, and nothing reads `rt` while
                // it is replaced; the parent's copy is forgotten (ManuallyDrop).
                unsafe { *session.rt.get() = ManuallyDrop::new(rt) };
                session.pid.store(me, Relaxed);
                signals::adopt(session.slot);
            }
            Err(why) => eprintln!(
                "rmem: this fork() child has no remote memory of its parent's session: {why}; \
                 touching its arrays stops it"
            ),
        }
        // The child's copy of the parent's reference: never dropped here (the count is the
        // parent's too, and a drop could end a runtime that is not this process's).
        std::mem::forget(session);
    }
    signals::guard_unserved();
}
