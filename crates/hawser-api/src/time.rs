//! UTC calendar time from Unix seconds, for names and reports (backup names, the bench's
//! report): spares a date crate for a time stamp.

/// Unix seconds as UTC (year, month, day, hour, minute, second).
pub fn utc(unix_secs: u64) -> (i64, i64, i64, u64, u64, u64) {
    let (days, rem) = (unix_secs / 86_400, unix_secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days).unwrap_or(i64::MAX / 2));
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Unix seconds as an RFC 3339 UTC time, `2026-11-28T10:15:00Z`.
pub fn rfc3339(unix_secs: u64) -> String {
    let (y, m, d, hh, mm, ss) = utc(unix_secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day), after Howard Hinnant's
/// `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
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
    }
}
