//! A waker for futures a task polls itself, that turns a wake-up given while the task is
//! polling them into a note instead of a real wake-up of the task.
//!
//! Why: tokio requeues a task that was woken while it was running, and to do so it wakes a
//! parked worker thread, which finds nothing to do and parks again (two context switches and
//! a futex wake-up, on each side). `FuturesUnordered` wakes its task every time it has polled
//! each of its futures once in a call (its guard against starving other tasks), and with one
//! request in flight that is every request. The NBD connection task runs its own rounds, and
//! yields by itself after a bounded number of them, so it needs no such guard: a wake-up
//! during its poll only means "go round once more".

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Waker};

use futures_util::task::{waker, ArcWake, AtomicWaker};

/// The task is not polling: a wake-up goes to the task.
const IDLE: u8 = 0;
/// The task is polling: a wake-up is only noted.
const POLLING: u8 = 1;
/// A wake-up came while the task was polling.
const WOKEN: u8 = 2;

struct State {
    state: AtomicU8,
    task: AtomicWaker,
}

impl ArcWake for State {
    fn wake_by_ref(me: &Arc<Self>) {
        let mut now = me.state.load(Ordering::Acquire);
        loop {
            match now {
                IDLE => return me.task.wake(),
                WOKEN => return,
                _ => match me.state.compare_exchange(
                    POLLING,
                    WOKEN,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return,
                    Err(seen) => now = seen,
                },
            }
        }
    }
}

/// Hands out the waker; one per task.
pub struct OwnWake {
    state: Arc<State>,
    waker: Waker,
}

impl Default for OwnWake {
    fn default() -> Self {
        let state = Arc::new(State {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
        });
        OwnWake {
            waker: waker(state.clone()),
            state,
        }
    }
}

impl OwnWake {
    /// Run `f` with a context whose waker notes wake-ups while `f` runs and wakes the task of
    /// `cx` after. Returns what `f` returned, and whether it was woken meanwhile (the caller
    /// must then poll again before it returns `Pending`).
    pub fn poll<T>(&self, cx: &Context<'_>, f: impl FnOnce(&mut Context<'_>) -> T) -> (T, bool) {
        self.state.task.register(cx.waker());
        self.state.state.store(POLLING, Ordering::Release);
        let out = f(&mut Context::from_waker(&self.waker));
        let woken = self.state.state.swap(IDLE, Ordering::AcqRel) == WOKEN;
        (out, woken)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    struct Count(AtomicUsize);
    impl ArcWake for Count {
        fn wake_by_ref(me: &Arc<Self>) {
            me.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_wake_while_polling_is_noted_and_one_after_reaches_the_task() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let task = waker(count.clone());
        let cx = Context::from_waker(&task);
        let own = OwnWake::default();
        let mut kept = None;
        let ((), woken) = own.poll(&cx, |inner| {
            inner.waker().wake_by_ref();
            kept = Some(inner.waker().clone());
        });
        assert!(woken);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        let ((), woken) = own.poll(&cx, |_| ());
        assert!(!woken);
        kept.expect("kept").wake();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
