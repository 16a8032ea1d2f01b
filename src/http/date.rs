//! The `Date` header value (IMF-fixdate), computed at most once per second
//! per thread: no lock, no shared state between handler threads.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

pub const DATE_LEN: usize = 29;

thread_local! {
    static CACHE: RefCell<(u64, [u8; DATE_LEN])> = const { RefCell::new((u64::MAX, [0; DATE_LEN])) };
}

/// Call `f` with the current date, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn with_now<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    CACHE.with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.0 != secs {
            cache.1 = format_imf(secs);
            cache.0 = secs;
        }
        f(&cache.1)
    })
}

/// Format Unix seconds as an IMF-fixdate.
pub fn format_imf(secs: u64) -> [u8; DATE_LEN] {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days as i64);
    let mut out = *b"Thu, 01 Jan 1970 00:00:00 GMT";
    out[..3].copy_from_slice(DAYS[(days % 7) as usize]);
    two(&mut out[5..7], day);
    out[8..11].copy_from_slice(MONTHS[(month - 1) as usize]);
    let y = year as u32;
    two(&mut out[12..14], y / 100);
    two(&mut out[14..16], y % 100);
    two(&mut out[17..19], (rem / 3600) as u32);
    two(&mut out[20..22], (rem / 60 % 60) as u32);
    two(&mut out[23..25], (rem % 60) as u32);
    out
}

fn two(dst: &mut [u8], v: u32) {
    dst[0] = b'0' + (v / 10 % 10) as u8;
    dst[1] = b'0' + (v % 10) as u8;
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
pub(crate) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        assert_eq!(&format_imf(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(&format_imf(784_111_777), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&format_imf(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(&format_imf(1_798_761_599), b"Thu, 31 Dec 2026 23:59:59 GMT");
    }
}
