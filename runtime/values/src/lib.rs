//! The forms a value an operator writes takes, shared by every setting of
//! every binary (through `ccm-runtime`) and every provider's annotations
//! (through `ccm-provider`): durations with a unit, and how an error quotes
//! a value; and the cloud's limits on a load balancer's hosts
//! ([`host_limits`]), which the service controller and every provider read
//! alike. The lowest floor: it depends on nothing.

pub mod host_limits;

/// How much of a value an error message quotes.
const QUOTED: usize = 40;

/// `value` quoted for an error message, cut to its first 40 bytes with its
/// length named: an error never repeats a whole oversized input.
pub fn quote(value: &str) -> String {
    if value.len() <= QUOTED {
        return format!("{value:?}");
    }
    let mut end = QUOTED;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &value[..end], value.len())
}

/// Parses a duration such as `250ms`, `10s`, `1.5m` or `2h`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| "needs a unit (ms, s, m or h)".to_owned())?;
    let (number, unit) = s.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| "is not a duration such as 250ms, 10s or 5m".to_owned())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("unknown unit {unit:?}; use ms, s, m or h")),
    };
    std::time::Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
}
