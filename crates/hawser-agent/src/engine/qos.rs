//! Per-volume QoS: the volume's limits ([`hawser_api::Qos`]) applied to its client requests at
//! the export (`engine/registry.rs`), before a request passes the export's gate. A request waiting
//! here holds nothing an engine swap or a snapshot pause waits for.
//!
//! Each limit is a token bucket kept as a theoretical arrival time (GCRA): a request of cost
//! `c` against a rate `r` pushes the bucket's time `c / r` further, and may start once that
//! time, before the push, is no more than [`BURST`] ahead of now. So a volume idle for a while
//! may send [`BURST`] worth of requests at once, and over any longer span gets the rate and no
//! more. A request never waits in a queue behind others: it reserves its slot when it arrives
//! and sleeps until then (a timer, no polling), so requests start in arrival order at the rate.
//! A request larger than the burst (a 32 MiB write under a 1 MiB/s cap) goes when the
//! bucket is full and leaves it in debt, which the following requests wait out.
//!
//! An unlimited volume pays one atomic load per request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hawser_api::Qos;
use tokio::time::Instant;

/// How far ahead of the rate a volume may run after being idle.
pub const BURST: Duration = Duration::from_millis(100);

/// What a client request costs against the limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    Read {
        bytes: u64,
    },
    /// A write, trim or zeroing; `bytes` is the data sent (none for trims and zeroings).
    Write {
        bytes: u64,
    },
    /// Flushes are not limited.
    Free,
}

#[derive(Default)]
pub struct QosLimiter {
    /// Whether any limit is set: read without the lock on every request.
    limited: AtomicBool,
    buckets: Mutex<Buckets>,
}

#[derive(Default)]
struct Buckets {
    qos: Qos,
    read_iops: Bucket,
    write_iops: Bucket,
    iops: Bucket,
    read_bytes: Bucket,
    write_bytes: Bucket,
    bytes: Bucket,
}

/// One limit: `rate` units a second (0: none), and the bucket's theoretical arrival time.
#[derive(Default)]
struct Bucket {
    rate: u64,
    tat: Option<Instant>,
}

impl Bucket {
    /// Reserves `cost` units at `now`; returns when the request may start.
    fn reserve(&mut self, now: Instant, cost: u64) -> Instant {
        if self.rate == 0 || cost == 0 {
            return now;
        }
        let tat = self.tat.map_or(now, |t| t.max(now));
        let nanos = u128::from(cost) * 1_000_000_000 / u128::from(self.rate);
        let step = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        // Costs are at most a request's u32 length, so the step is at most 136 years: no
        // overflow on Linux's Instant, but never panic if there were one.
        self.tat = Some(tat.checked_add(step).unwrap_or(tat));
        tat.checked_sub(BURST).map_or(now, |at| at.max(now))
    }

    fn set(&mut self, rate: u64) {
        if rate != self.rate {
            *self = Bucket { rate, tat: None };
        }
    }
}

impl QosLimiter {
    pub fn new(qos: Qos) -> QosLimiter {
        let limiter = QosLimiter::default();
        limiter.set(qos);
        limiter
    }

    /// Changes the limits now. A bucket whose rate changed starts afresh (a raised cap takes
    /// effect at once); requests already waiting keep the slot they reserved.
    pub fn set(&self, qos: Qos) {
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        b.qos = qos;
        b.read_iops.set(qos.read_iops);
        b.write_iops.set(qos.write_iops);
        b.iops.set(qos.iops);
        b.read_bytes.set(qos.read_bytes_per_sec);
        b.write_bytes.set(qos.write_bytes_per_sec);
        b.bytes.set(qos.bytes_per_sec);
        self.limited.store(!qos.is_unlimited(), Ordering::Release);
    }

    pub fn get(&self) -> Qos {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).qos
    }

    /// When a request of `cost` arriving at `now` may start (now, if no limit holds it).
    pub fn reserve(&self, now: Instant, cost: Cost) -> Instant {
        if !self.limited.load(Ordering::Acquire) {
            return now;
        }
        let mut b = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let (ops, bytes, by_kind) = match cost {
            Cost::Free => return now,
            Cost::Read { bytes } => (&mut b.read_iops, bytes, false),
            Cost::Write { bytes } => (&mut b.write_iops, bytes, true),
        };
        let mut at = ops.reserve(now, 1);
        let b = &mut *b;
        let kind_bytes = if by_kind {
            &mut b.write_bytes
        } else {
            &mut b.read_bytes
        };
        at = at.max(kind_bytes.reserve(now, bytes));
        at = at.max(b.iops.reserve(now, 1));
        at.max(b.bytes.reserve(now, bytes))
    }

    /// Waits until a request of `cost` may start; returns at once when no limit holds it.
    /// Returns how long it waited.
    pub async fn admit(&self, cost: Cost) -> Duration {
        if !self.limited.load(Ordering::Acquire) {
            return Duration::ZERO;
        }
        let now = Instant::now();
        let at = self.reserve(now, cost);
        if at > now {
            tokio::time::sleep_until(at).await;
        }
        at.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(qos: Qos) -> QosLimiter {
        QosLimiter::new(qos)
    }

    /// Requests started in `span` at a steady offered load far above the cap.
    fn started(l: &QosLimiter, cost: Cost, span: Duration) -> u64 {
        let t0 = Instant::now();
        let mut n = 0;
        // Offer a request every 10 µs; count those whose start falls inside the span.
        let mut now = t0;
        while now < t0 + span {
            if l.reserve(now, cost) < t0 + span {
                n += 1;
            }
            now += Duration::from_micros(10);
        }
        n
    }

    #[test]
    fn an_iops_cap_holds_over_a_long_span_with_one_burst() {
        let l = limiter(Qos {
            write_iops: 1000,
            ..Qos::default()
        });
        let n = started(&l, Cost::Write { bytes: 4096 }, Duration::from_secs(20));
        // 20 s at 1000/s, plus the burst (100 ms of it).
        assert_eq!(n, 20_000 + 100);
        // Reads are not writes.
        let t = Instant::now();
        assert_eq!(l.reserve(t, Cost::Read { bytes: 4096 }), t);
    }

    #[test]
    fn bandwidth_caps_count_bytes_and_the_total_counts_both_kinds() {
        let l = limiter(Qos {
            bytes_per_sec: 1 << 20,
            ..Qos::default()
        });
        let span = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut moved = 0u64;
        let mut now = t0;
        let mut i = 0u64;
        while now < t0 + span {
            let cost = if i.is_multiple_of(2) {
                Cost::Read { bytes: 65536 }
            } else {
                Cost::Write { bytes: 65536 }
            };
            if l.reserve(now, cost) < t0 + span {
                moved += 65536;
            }
            now += Duration::from_micros(100);
            i += 1;
        }
        // 10 MiB in 10 s, plus at most the burst and one request.
        let cap = 10 << 20;
        assert!(
            moved >= cap && moved <= cap + (1 << 20) / 10 + 65536,
            "{moved}"
        );
    }

    #[test]
    fn a_large_request_goes_when_the_bucket_is_full_and_the_next_one_waits_its_cost() {
        let l = limiter(Qos {
            write_bytes_per_sec: 1 << 20,
            ..Qos::default()
        });
        let t0 = Instant::now();
        assert_eq!(l.reserve(t0, Cost::Write { bytes: 4 << 20 }), t0);
        let next = l.reserve(t0, Cost::Write { bytes: 4096 });
        assert_eq!(next - t0, Duration::from_secs(4) - BURST);
        // Trims and zeroings cost an operation, not bytes; flushes cost nothing.
        assert_eq!(l.reserve(t0, Cost::Write { bytes: 0 }), t0);
        assert_eq!(l.reserve(t0, Cost::Free), t0);
    }

    #[test]
    fn raising_a_cap_takes_effect_at_once_and_removing_all_limits_stops_counting() {
        let l = limiter(Qos {
            iops: 10,
            ..Qos::default()
        });
        let t0 = Instant::now();
        for _ in 0..50 {
            l.reserve(t0, Cost::Read { bytes: 512 });
        }
        // Deep in debt at 10/s.
        assert!(l.reserve(t0, Cost::Read { bytes: 512 }) > t0 + Duration::from_secs(4));
        l.set(Qos {
            iops: 100_000,
            ..Qos::default()
        });
        assert_eq!(l.reserve(t0, Cost::Read { bytes: 512 }), t0);
        assert_eq!(l.get().iops, 100_000);
        l.set(Qos::default());
        assert!(!l.limited.load(Ordering::Acquire));
        assert_eq!(l.reserve(t0, Cost::Write { bytes: 1 << 30 }), t0);
    }

    #[tokio::test(start_paused = true)]
    async fn admit_sleeps_until_the_slot_on_the_runtime_clock() {
        let l = limiter(Qos {
            read_iops: 10,
            ..Qos::default()
        });
        let t0 = Instant::now();
        // The burst (1 + 100 ms at 10/s = 2 requests) goes at once, the rest 100 ms apart.
        for _ in 0..2 {
            l.admit(Cost::Read { bytes: 4096 }).await;
        }
        assert_eq!(Instant::now(), t0);
        let waited = l.admit(Cost::Read { bytes: 4096 }).await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(100));
        assert_eq!(waited, Duration::from_millis(100));
        l.admit(Cost::Read { bytes: 4096 }).await;
        assert_eq!(Instant::now() - t0, Duration::from_millis(200));
    }
}
