//! A token bucket for background traffic (resync), so a resync cannot starve client I/O.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Parse a rate in bytes per second: a byte count with an optional unit and an optional "/s"
/// ("200MiB", "1GiB/s", "0"). Zero means unlimited.
pub fn parse_rate(input: &str) -> Result<u64, String> {
    let count = input.trim();
    let count = count.strip_suffix("/s").unwrap_or(count);
    hawser_api::parse_bytes(count).map_err(|e| {
        format!("rate {input:?} is not bytes per second like 200MiB or 1GiB/s (0 = unlimited): {e}")
    })
}

/// The limiter for a rate from [`parse_rate`]: none when unlimited.
pub fn limiter(bytes_per_sec: u64) -> Option<std::sync::Arc<RateLimiter>> {
    (bytes_per_sec > 0).then(|| std::sync::Arc::new(RateLimiter::new(bytes_per_sec)))
}

pub struct RateLimiter {
    bytes_per_sec: u64,
    /// (tokens available, when they were counted). Tokens may go negative: a large request
    /// borrows from the future and later ones wait for the debt.
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    pub fn new(bytes_per_sec: u64) -> RateLimiter {
        assert!(bytes_per_sec > 0);
        RateLimiter {
            bytes_per_sec,
            // A burst of a quarter second to start with.
            state: Mutex::new((bytes_per_sec as f64 / 4.0, Instant::now())),
        }
    }

    /// Wait until `bytes` may go.
    pub async fn acquire(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let wait = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let rate = self.bytes_per_sec as f64;
            let refill = now.duration_since(st.1).as_secs_f64() * rate;
            // At most one second of burst.
            st.0 = (st.0 + refill).min(rate);
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
        assert!(limiter(0).is_none());
        assert!(limiter(1).is_some());
        let err = parse_rate("fast").expect_err("not a rate");
        assert!(err.contains("bytes per second"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_is_held_over_many_requests() {
        let l = RateLimiter::new(1 << 20); // 1 MiB/s
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
}
