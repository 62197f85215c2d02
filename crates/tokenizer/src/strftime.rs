//! `strftime_now(format)` for chat templates (Llama 3.1+, Granite and gpt-oss templates put
//! today's date in the system prompt): Python's `datetime.now().strftime(format)`, which
//! transformers registers, for UTC and the C locale.
//!
//! Supported directives (Python's, C89 set): `%a %A %b %B %d %e %H %I %j %m %M %p %S %y %Y
//! %w %%`; any other is an error naming it rather than a wrong date.

use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The proleptic Gregorian (year, month 1-12, day 1-31) of `days` since 1970-01-01: the
/// standard days-to-civil conversion over 400-year eras of 146097 days.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// `t` (UTC) formatted as Python's `strftime(fmt)` in the C locale.
///
/// Errors: a directive outside the supported set, or a `%` at the end.
pub(crate) fn format(fmt: &str, t: SystemTime) -> Result<String, String> {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let wd = (days + 3).rem_euclid(7) as usize;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[m as usize - 1] + d + u32::from(m > 2 && is_leap(y));
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('a') => out.push_str(&DAYS[wd][..3]),
            Some('A') => out.push_str(DAYS[wd]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hh + 11) % 12 + 1)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('Y') => out.push_str(&y.to_string()),
            Some('w') => out.push_str(&((wd + 1) % 7).to_string()),
            Some('%') => out.push('%'),
            Some(other) => return Err(format!("strftime_now: unsupported directive %{other}")),
            None => return Err("strftime_now: a format ending in %".into()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::format;
    use std::time::{Duration, UNIX_EPOCH};

    /// Against Python's `datetime(…).strftime(…)` (values checked with CPython 3.11).
    #[test]
    fn dates_format_as_python_does() {
        // 2026-07-26 14:05:09 UTC is a Sunday, day 207 of the year.
        let t = UNIX_EPOCH + Duration::from_secs(1_785_074_709);
        assert_eq!(
            format("%d %b %Y|%A %B %e|%H:%M:%S %I%p|%j %y %m %w %a %%", t).unwrap(),
            "26 Jul 2026|Sunday July 26|14:05:09 02PM|207 26 07 0 Sun %"
        );
        // A leap day and the day after.
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(
            format("%Y-%m-%d %j %A", t).unwrap(),
            "2000-02-29 060 Tuesday"
        );
        let t = UNIX_EPOCH + Duration::from_secs(951_868_800);
        assert_eq!(format("%Y-%m-%d %j", t).unwrap(), "2000-03-01 061");
        assert_eq!(format("%d", UNIX_EPOCH).unwrap(), "01");
        assert!(format("%Q", UNIX_EPOCH).unwrap_err().contains("%Q"));
        assert!(format("50%", UNIX_EPOCH).is_err());
    }
}
