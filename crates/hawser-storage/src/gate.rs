//! A replica's epoch gate: data operations in flight on one side, epoch changes on the other
//! (see `replica.rs` for why). A data operation holds a [`Ticket`] from its epoch check until
//! its I/O is over; raising the epoch waits until no ticket is out, and no new ticket is given
//! while a raise waits or runs. A ticket is an owned value, not a lock guard, because an
//! operation submitted to the io_uring (`ring.rs`) ends on another thread than it began.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Default)]
pub struct EpochGate {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Tickets out.
    ops: usize,
    /// Epoch changes waiting or running: while any, no ticket is given.
    raisers: usize,
    /// An epoch change is running (they run one at a time).
    raising: bool,
}

/// Leave to run one data operation; dropping it ends the operation.
pub struct Ticket {
    gate: Arc<EpochGate>,
}

/// An epoch change under way; dropping it lets data operations in again.
pub struct Raise<'a> {
    gate: &'a EpochGate,
}

impl EpochGate {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A ticket, waiting while an epoch change waits or runs.
    pub fn enter(self: &Arc<Self>) -> Ticket {
        let mut s = self.lock();
        while s.raisers > 0 {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.ops += 1;
        Ticket { gate: self.clone() }
    }

    /// A ticket now, or `None` while an epoch change waits or runs. For threads that must not
    /// block on the gate: the io_uring's completion thread, which the change waits for.
    pub fn try_enter(self: &Arc<Self>) -> Option<Ticket> {
        let mut s = self.lock();
        if s.raisers > 0 {
            return None;
        }
        s.ops += 1;
        Some(Ticket { gate: self.clone() })
    }

    /// Wait until no data operation is in flight, then hold every new one off until the
    /// returned guard drops.
    pub fn raise(&self) -> Raise<'_> {
        let mut s = self.lock();
        s.raisers += 1;
        while s.ops > 0 || s.raising {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.raising = true;
        Raise { gate: self }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.ops -= 1;
        if s.ops == 0 && s.raisers > 0 {
            drop(s);
            self.gate.changed.notify_all();
        }
    }
}

impl Drop for Raise<'_> {
    fn drop(&mut self) {
        let mut s = self.gate.lock();
        s.raising = false;
        s.raisers -= 1;
        drop(s);
        self.gate.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_raise_waits_for_every_ticket_and_holds_new_ones_off() {
        let gate = Arc::new(EpochGate::default());
        let first = gate.enter();
        let second = gate.try_enter().expect("no raise yet");
        let raised = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let raiser = std::thread::spawn({
            let (gate, raised) = (gate.clone(), raised.clone());
            move || {
                let guard = gate.raise();
                raised.store(true, Ordering::SeqCst);
                rx.recv().expect("told to finish");
                drop(guard);
            }
        });
        // Wait until the raiser is registered (it then refuses try_enter).
        while gate.try_enter().is_some() {
            std::thread::yield_now();
        }
        drop(first);
        assert!(!raised.load(Ordering::SeqCst), "raised with a ticket out");
        // A ticket dropped on another thread than it was taken on (as the ring does).
        std::thread::spawn(move || drop(second))
            .join()
            .expect("drop");
        while !raised.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        // While the raise runs, `enter` waits and `try_enter` refuses.
        let (entered_tx, entered_rx) = mpsc::channel();
        let waiter = std::thread::spawn({
            let gate = gate.clone();
            move || {
                let t = gate.enter();
                entered_tx.send(()).expect("send");
                drop(t);
            }
        });
        assert!(gate.try_enter().is_none());
        assert!(entered_rx.recv_timeout(Duration::from_millis(50)).is_err());
        tx.send(()).expect("finish the raise");
        raiser.join().expect("raiser");
        entered_rx.recv().expect("entered after the raise");
        waiter.join().expect("waiter");
        assert!(gate.try_enter().is_some());
    }
}
