//! A token bucket for background traffic (resync), so a resync cannot starve client I/O.
//!
//! Two rates, like DRBD's c-max-rate and c-min-rate: `max` always, and a lower `busy` rate
//! while the volume has client I/O (any request in the last [`BUSY_WINDOW`]). A resync of an
//! idle volume then runs as fast as allowed, and one under load leaves the disk to the client.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Client I/O this recent makes the volume busy.
pub const BUSY_WINDOW: Duration = Duration::from_millis(250);

/// The resync rates of an engine, bytes per second; 0 means no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncRates {
    /// Always.
    pub max: u64,
    /// While the volume has client I/O.
    pub busy: u64,
}

impl Default for ResyncRates {
    /// The agent's defaults.
    fn default() -> ResyncRates {
        ResyncRates {
            max: crate::constants::DEFAULT_RESYNC_RATE,
            busy: crate::constants::DEFAULT_RESYNC_BUSY_RATE,
        }
    }
}

impl ResyncRates {
    /// The limit now: `busy` says whether the volume has client I/O. `None`: unlimited.
    fn now(&self, busy: bool) -> Option<u64> {
        let limits = [Some(self.max), busy.then_some(self.busy)];
        limits.into_iter().flatten().filter(|r| *r > 0).min()
    }
}

/// Parse a rate in bytes per second: a byte count with an optional unit and an optional "/s"
/// ("200MiB", "1GiB/s", "0"). Zero means unlimited.
pub fn parse_rate(input: &str) -> Result<u64, String> {
    let count = input.trim();
    let count = count.strip_suffix("/s").unwrap_or(count);
    hawser_api::parse_bytes(count).map_err(|e| {
        format!("rate {input:?} is not bytes per second like 200MiB or 1GiB/s (0 = unlimited): {e}")
    })
}

/// The limiter for rates from [`parse_rate`]: none when both are unlimited.
pub fn limiter(rates: ResyncRates) -> Option<std::sync::Arc<RateLimiter>> {
    (rates.max > 0 || rates.busy > 0).then(|| std::sync::Arc::new(RateLimiter::new(rates)))
}

pub struct RateLimiter {
    rates: ResyncRates,
    /// When this limiter was made: the origin of `last_client_io`.
    origin: Instant,
    /// Microseconds after `origin` of the latest client request (0: none yet).
    last_client_io: AtomicU64,
    /// (tokens available, when they were counted). Tokens may go negative: a large request
    /// borrows from the future and later ones wait for the debt.
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(rates: ResyncRates) -> RateLimiter {
        let start = rates.now(false).or(rates.now(true)).unwrap_or(1) as f64;
        let now = Instant::now();
        RateLimiter {
            rates,
            origin: now,
            last_client_io: AtomicU64::new(0),
            // A burst of a quarter second to start with.
            state: Mutex::new((start / 4.0, now)),
        }
    }

    /// A client request arrived (cheap: one clock read and one store).
    pub fn note_client_io(&self) {
        let us = self.origin.elapsed().as_micros().max(1);
        self.last_client_io
            .store(u64::try_from(us).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn busy(&self, now: Instant) -> bool {
        let last = self.last_client_io.load(Ordering::Relaxed);
        last > 0 && now.duration_since(self.origin) < Duration::from_micros(last) + BUSY_WINDOW
    }

    /// Wait until `bytes` may go.
    pub async fn acquire(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let wait = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let Some(rate) = self.rates.now(self.busy(now)) else {
                st.1 = now;
                return;
            };
            let rate = rate as f64;
            let refill = now.duration_since(st.1).as_secs_f64() * rate;
            // At most a tenth of a second of burst: when client I/O starts, what the idle
            // rate saved up must not land on it at once.
            st.0 = (st.0 + refill).min(rate / 10.0);
            st.1 = now;
            st.0 -= bytes as f64;
            if st.0 >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-st.0 / rate)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_with_units_and_zero_is_unlimited() {
        assert_eq!(parse_rate("0"), Ok(0));
        assert_eq!(parse_rate("200MiB"), Ok(200 << 20));
        assert_eq!(parse_rate("1GiB/s"), Ok(1 << 30));
        assert_eq!(parse_rate("100MB"), Ok(100_000_000));
        let rates = |max, busy| ResyncRates { max, busy };
        assert!(limiter(rates(0, 0)).is_none());
        assert!(limiter(rates(1, 0)).is_some());
        assert!(limiter(rates(0, 1)).is_some());
        let err = parse_rate("fast").expect_err("not a rate");
        assert!(err.contains("bytes per second"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_is_held_over_many_requests() {
        let l = RateLimiter::new(ResyncRates {
            max: 1 << 20, // 1 MiB/s
            busy: 0,
        });
        let start = tokio::time::Instant::now();
        for _ in 0..20 {
            l.acquire(256 << 10).await; // 5 MiB in all
        }
        let took = start.elapsed();
        // 5 MiB minus the 256 KiB initial burst at 1 MiB/s.
        assert!(
            took >= Duration::from_millis(4700) && took <= Duration::from_millis(5100),
            "took {took:?}"
        );
    }

    /// Client I/O slows the resync to the busy rate; once the client is quiet for the busy
    /// window, the full rate returns.
    #[tokio::test(start_paused = true)]
    async fn client_io_slows_to_the_busy_rate_and_quiet_restores_the_full_rate() {
        let l = RateLimiter::new(ResyncRates {
            max: 4 << 20,  // 4 MiB/s
            busy: 1 << 20, // 1 MiB/s
        });
        let timed = |mib: u64| {
            let l = &l;
            async move {
                let start = tokio::time::Instant::now();
                for _ in 0..mib * 4 {
                    l.acquire(256 << 10).await;
                }
                start.elapsed()
            }
        };
        // Use up the initial burst, then 4 MiB at the full rate: about 1 s.
        timed(1).await;
        let idle = timed(4).await;
        assert!(idle <= Duration::from_millis(1100), "idle: {idle:?}");
        // A client request before each step: 2 MiB at the busy rate, about 2 s.
        let start = tokio::time::Instant::now();
        for _ in 0..8 {
            l.note_client_io();
            l.acquire(256 << 10).await;
        }
        let busy = start.elapsed();
        assert!(busy >= Duration::from_millis(1700), "busy: {busy:?}");
        // Quiet for longer than the window: the full rate again.
        tokio::time::sleep(BUSY_WINDOW * 2).await;
        timed(1).await; // whatever burst built up meanwhile
        let again = timed(4).await;
        assert!(
            again <= Duration::from_millis(1100),
            "quiet again: {again:?}"
        );
    }
}
