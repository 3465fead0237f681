//! A port's rate limits: a policer per direction, as VPP's policers and
//! OVS's `ingress_policing_rate` are, in the units of the CNI `bandwidth`
//! capability (bits a second, bursts in bits), with packets a second
//! beside (tc `police pkts_rate`, VPP's packet-rate policers).
//!
//! Directions are the **switch's**: `rx` is what the switch receives from
//! the port (a pod's egress), `tx` what it sends to the port (a pod's
//! ingress). The CNI plugin maps the capability's `ingressRate` to `tx` and
//! `egressRate` to `rx`.
//!
//! In JSON and TOML:
//!
//! ```json
//! {"rx": {"bits_per_sec": 100000000, "burst_bits": 10000000}, "tx": {"packets_per_sec": 50000}}
//! ```
//!
//! On the command line a meter is `rate=100M,burst=10M,pps=50k,pps-burst=64`
//! (SI suffixes k, M, G, T).

use serde::{Deserialize, Serialize};

use super::SpecError;

/// A port's rate limits, per direction as the switch sees it; a direction
/// absent is not limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    /// Frames the switch receives from the port: what its station sends
    /// (a pod's egress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx: Option<Meter>,
    /// Frames the switch sends to the port: what its station receives (a
    /// pod's ingress).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx: Option<Meter>,
}

impl RateLimits {
    /// Neither direction limited.
    pub fn is_empty(&self) -> bool {
        self.rx.is_none() && self.tx.is_none()
    }

    /// The limits with every bucket's size filled in, as they apply.
    pub fn applied(&self) -> RateLimits {
        RateLimits {
            rx: self.rx.map(|m| m.applied()),
            tx: self.tx.map(|m| m.applied()),
        }
    }

    /// Checks both meters; `at` prefixes field names (`port[1].rate_limit.`).
    pub fn validate(&self, at: &str) -> Result<(), SpecError> {
        if let Some(m) = &self.rx {
            m.validate(&format!("{at}rx."))?;
        }
        if let Some(m) = &self.tx {
            m.validate(&format!("{at}tx."))?;
        }
        Ok(())
    }
}

/// One direction's policer: a token bucket of bits, one of packets, or
/// both (a frame passes when both hold enough). A frame that finds a
/// bucket short is dropped, not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meter {
    /// Bits a second (of whole Ethernet frames, without preamble and FCS),
    /// as the `bandwidth` capability's `ingressRate` and `egressRate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_sec: Option<u64>,
    /// The bucket of bits (the burst at line rate after a quiet spell), as
    /// the capability's `ingressBurst` and `egressBurst`. Default
    /// [`Meter::DEFAULT_BURST_SHARE`] of a second at the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_bits: Option<u64>,
    /// Frames a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets_per_sec: Option<u64>,
    /// The bucket of frames. Default [`Meter::DEFAULT_BURST_SHARE`] of a
    /// second at the rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_packets: Option<u64>,
}

impl Meter {
    /// The share of a second at the rate a bucket holds unless told
    /// (80%, what Open vSwitch advises for `ingress_policing_burst` so that
    /// TCP reaches the rate).
    pub const DEFAULT_BURST_SHARE: (u64, u64) = (8, 10);

    /// Checks the meter; `at` prefixes field names.
    pub fn validate(&self, at: &str) -> Result<(), SpecError> {
        for (rate, burst, rate_name, burst_name) in [
            (
                self.bits_per_sec,
                self.burst_bits,
                "bits_per_sec",
                "burst_bits",
            ),
            (
                self.packets_per_sec,
                self.burst_packets,
                "packets_per_sec",
                "burst_packets",
            ),
        ] {
            if rate == Some(0) {
                return Err(SpecError::new(
                    format!("{at}{rate_name}"),
                    "0 passes nothing; leave the direction out for no limit",
                ));
            }
            if burst == Some(0) {
                return Err(SpecError::new(
                    format!("{at}{burst_name}"),
                    "an empty bucket passes nothing",
                ));
            }
            if burst.is_some() && rate.is_none() {
                return Err(SpecError::new(
                    format!("{at}{burst_name}"),
                    format!("a burst without {rate_name}"),
                ));
            }
        }
        if self.bits_per_sec.is_none() && self.packets_per_sec.is_none() {
            return Err(SpecError::new(
                format!("{at}bits_per_sec"),
                "a meter needs bits_per_sec, packets_per_sec or both",
            ));
        }
        Ok(())
    }

    /// The meter with its buckets' sizes filled in, as it applies.
    pub fn applied(&self) -> Meter {
        let bits = self.bits_bucket();
        let packets = self.packets_bucket();
        Meter {
            bits_per_sec: bits.map(|b| b.0),
            burst_bits: bits.map(|b| b.1),
            packets_per_sec: packets.map(|b| b.0),
            burst_packets: packets.map(|b| b.1),
        }
    }

    /// The bucket of bits, if the meter counts bits.
    pub fn bits_bucket(&self) -> Option<(u64, u64)> {
        let rate = self.bits_per_sec?;
        Some((rate, self.burst_bits.unwrap_or_else(|| default_burst(rate))))
    }

    /// The bucket of frames, if the meter counts frames.
    pub fn packets_bucket(&self) -> Option<(u64, u64)> {
        let rate = self.packets_per_sec?;
        Some((
            rate,
            self.burst_packets.unwrap_or_else(|| default_burst(rate)),
        ))
    }
}

/// [`Meter::DEFAULT_BURST_SHARE`] of a second at `rate`, at least 1.
fn default_burst(rate: u64) -> u64 {
    let (num, den) = Meter::DEFAULT_BURST_SHARE;
    (u128::from(rate) * u128::from(num) / u128::from(den)).clamp(1, u128::from(u64::MAX)) as u64
}

/// Reads `100M`, `1.5G`, `64k` or `1000`: SI suffixes (powers of 1000).
pub fn parse_si(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_lowercase() {
                'k' => 1_000,
                'm' => 1_000_000,
                'g' => 1_000_000_000,
                't' => 1_000_000_000_000,
                _ => return Err(format!("{text:?}: unknown suffix {c:?} (k, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let bad = || format!("{text:?} is no number (e.g. 100M, 1.5G, 64k)");
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(bad());
    }
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if !digits(whole) || !digits(frac) {
        return Err(bad());
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        // (39 digits and more: too large for the parse too.)
        whole.parse().map_err(|_| too_large_text(text))?
    };
    let too_large = || too_large_text(text);
    let mut value = whole.checked_mul(u128::from(mult)).ok_or_else(too_large)?;
    let mut scale = u128::from(mult);
    for d in frac.chars() {
        scale /= 10;
        if scale == 0 {
            return Err(format!("{text:?}: finer than one unit"));
        }
        value = value
            .checked_add(u128::from(d.to_digit(10).unwrap_or(0)) * scale)
            .ok_or_else(too_large)?;
    }
    u64::try_from(value).map_err(|_| too_large_text(text))
}

/// The error for a number too large to read.
fn too_large_text(text: &str) -> String {
    format!("{text:?} is too large")
}

/// Writes `n` with the largest SI suffix that keeps it whole (`100M`).
pub fn format_si(n: u64) -> String {
    for (m, s) in [
        (1_000_000_000_000, "T"),
        (1_000_000_000, "G"),
        (1_000_000, "M"),
        (1_000, "k"),
    ] {
        if n >= m && n % m == 0 {
            return format!("{}{s}", n / m);
        }
    }
    n.to_string()
}

impl std::str::FromStr for Meter {
    type Err = String;

    /// `rate=100M,burst=10M,pps=50k,pps-burst=64` (each optional, one of
    /// `rate` and `pps` needed), checked as a spec's meter is.
    fn from_str(s: &str) -> Result<Meter, String> {
        let mut m = Meter::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: want key=value (rate, burst, pps, pps-burst)"))?;
            let v = parse_si(value).map_err(|e| format!("{key}: {e}"))?;
            let slot = match key.trim() {
                "rate" => &mut m.bits_per_sec,
                "burst" => &mut m.burst_bits,
                "pps" => &mut m.packets_per_sec,
                "pps-burst" => &mut m.burst_packets,
                k => return Err(format!("{k:?}: unknown key (rate, burst, pps, pps-burst)")),
            };
            *slot = Some(v);
        }
        m.validate("").map_err(|e| {
            // Named as the command line names them.
            e.to_string()
                .replace("bits_per_sec", "rate")
                .replace("burst_bits", "burst")
                .replace("burst_packets", "pps-burst")
                .replace("packets_per_sec", "pps")
        })?;
        Ok(m)
    }
}

impl std::fmt::Display for Meter {
    /// As the command line writes it, buckets as they apply
    /// (`rate=100M,burst=80M`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some((rate, burst)) = self.bits_bucket() {
            parts.push(format!(
                "rate={},burst={}",
                format_si(rate),
                format_si(burst)
            ));
        }
        if let Some((rate, burst)) = self.packets_bucket() {
            parts.push(format!(
                "pps={},pps-burst={}",
                format_si(rate),
                format_si(burst)
            ));
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meters_read_from_the_command_line_and_json_alike() {
        let m: Meter = "rate=100M,burst=1.5M,pps=50k".parse().unwrap();
        assert_eq!(m.bits_bucket(), Some((100_000_000, 1_500_000)));
        assert_eq!(m.packets_bucket(), Some((50_000, 40_000)));
        assert_eq!(m.to_string(), "rate=100M,burst=1500k,pps=50k,pps-burst=40k");
        let j: Meter = serde_json::from_str(
            r#"{"bits_per_sec":100000000,"burst_bits":1500000,"packets_per_sec":50000}"#,
        )
        .unwrap();
        assert_eq!(j, m);
        assert_eq!(parse_si("1"), Ok(1));
        assert_eq!(parse_si("2.5k"), Ok(2500));
        assert_eq!(parse_si("10G"), Ok(10_000_000_000));
        assert!(parse_si("1.0001k").is_err());
        assert!(parse_si("5x").is_err());
        assert!(parse_si("").is_err());
        assert!(parse_si("99999999999T").is_err());
        assert!(parse_si("999999999999999999999999999999999999999T").is_err());
        assert!(parse_si("99999999999999999999999999999999999999999").is_err());
    }

    #[test]
    fn bad_meters_name_the_field() {
        let e = |m: Meter| m.validate("port.rate_limit.rx.").unwrap_err().to_string();
        assert!(e(Meter::default()).starts_with("port.rate_limit.rx.bits_per_sec:"));
        let zero = Meter {
            bits_per_sec: Some(0),
            ..Meter::default()
        };
        assert!(e(zero).starts_with("port.rate_limit.rx.bits_per_sec:"));
        let lone = Meter {
            packets_per_sec: Some(10),
            burst_bits: Some(10),
            ..Meter::default()
        };
        assert!(e(lone).starts_with("port.rate_limit.rx.burst_bits:"));
        let r = "burst=10M".parse::<Meter>().unwrap_err();
        assert!(r.starts_with("burst:"), "{r}");
        let r = "rate=10M,speed=1".parse::<Meter>().unwrap_err();
        assert!(r.contains("unknown key"), "{r}");
        let l: RateLimits = serde_json::from_str(r#"{"tx":{"packets_per_sec":7}}"#).unwrap();
        assert!(l.validate("x.").is_ok() && l.rx.is_none());
        assert!(serde_json::from_str::<RateLimits>(r#"{"in":{}}"#).is_err());
    }
}
