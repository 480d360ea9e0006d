//! Kubernetes' `MicroTime`, the time format of a Lease's `acquireTime` and `renewTime` and of
//! an Event's `eventTime`, through the `time` crate (the workspace's date crate).

use std::time::{SystemTime, UNIX_EPOCH};

/// `t` as a Kubernetes MicroTime (`2006-01-02T15:04:05.000000Z`, UTC). A time before 1970 is
/// written as 1970-01-01, and one past 9999 as 9999's last microsecond: clocks give neither,
/// and a stamp is no reason to panic.
pub fn micro_time(t: SystemTime) -> String {
    let nanos = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let t = i128::try_from(nanos)
        .ok()
        .and_then(|n| time::OffsetDateTime::from_unix_timestamp_nanos(n).ok())
        .unwrap_or_else(|| time::PrimitiveDateTime::MAX.assume_utc());
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn micro_times() {
        assert_eq!(micro_time(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_795_600_539_123_456);
        assert_eq!(micro_time(t), "2026-11-25T09:55:39.123456Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(micro_time(leap), "2000-02-29T00:00:00.000000Z");
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(micro_time(before), "1970-01-01T00:00:00.000000Z");
        let far = UNIX_EPOCH + Duration::from_secs(400_000_000_000); // year 12,645
        assert_eq!(micro_time(far), "9999-12-31T23:59:59.999999Z");
    }
}
