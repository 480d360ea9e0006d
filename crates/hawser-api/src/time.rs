//! UTC calendar time from Unix seconds, for names and reports (backup names, the bench's
//! report, the CLI), through the `time` crate (already built for certificates' validity).

/// Unix seconds as UTC (year, month, day, hour, minute, second). A time past the `time`
/// crate's last day (9999-12-31) is that day's last second: these are names and reports.
pub fn utc(unix_secs: u64) -> (i64, i64, i64, u64, u64, u64) {
    let t = i64::try_from(unix_secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .unwrap_or_else(|| time::PrimitiveDateTime::MAX.assume_utc());
    (
        i64::from(t.year()),
        i64::from(u8::from(t.month())),
        i64::from(t.day()),
        u64::from(t.hour()),
        u64::from(t.minute()),
        u64::from(t.second()),
    )
}

/// Unix seconds as an RFC 3339 UTC time, `2026-11-28T10:15:00Z`.
pub fn rfc3339(unix_secs: u64) -> String {
    let (y, m, d, hh, mm, ss) = utc(unix_secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_across_leap_days_and_eras() {
        assert_eq!(utc(0), (1970, 1, 1, 0, 0, 0));
        assert_eq!(utc(951_782_400), (2000, 2, 29, 0, 0, 0));
        assert_eq!(utc(1_795_860_900), (2026, 11, 28, 10, 15, 0));
        assert_eq!(utc(5_097_600 + 59), (1970, 3, 1, 0, 0, 59));
        assert_eq!(rfc3339(1_795_860_900), "2026-11-28T10:15:00Z");
        assert_eq!(utc(u64::MAX), (9999, 12, 31, 23, 59, 59));
    }
}
