//! MAC addresses: the hot path's key and the specs' pinned addresses.

use std::fmt;
use std::str::FromStr;

/// A 48-bit IEEE MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// Builds an address from the first six bytes of `b` (which must hold six).
    #[inline]
    pub fn from_bytes(b: &[u8]) -> MacAddr {
        let mut a = [0u8; 6];
        a.copy_from_slice(&b[..6]);
        MacAddr(a)
    }

    /// True for group (multicast and broadcast) addresses.
    #[inline]
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    /// True for ff:ff:ff:ff:ff:ff.
    #[inline]
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// The address as the low 48 bits of a `u64`.
    #[inline]
    pub fn to_u64(&self) -> u64 {
        let b = self.0;
        (u64::from(b[0]) << 40)
            | (u64::from(b[1]) << 32)
            | (u64::from(b[2]) << 24)
            | (u64::from(b[3]) << 16)
            | (u64::from(b[4]) << 8)
            | u64::from(b[5])
    }

    /// The inverse of [`MacAddr::to_u64`]; bits above 48 are ignored.
    #[inline]
    pub fn from_u64(v: u64) -> MacAddr {
        let mut a = [0u8; 6];
        for (i, byte) in a.iter_mut().enumerate() {
            *byte = (v >> (40 - 8 * i)) as u8;
        }
        MacAddr(a)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for MacAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Error parsing a textual MAC address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address {0:?}: expected six hex octets like 02:00:00:00:00:01")]
pub struct MacParseError(pub String);

impl FromStr for MacAddr {
    type Err = MacParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 6];
        let mut n = 0;
        for part in s.split([':', '-']) {
            if n == 6 || part.len() != 2 {
                return Err(MacParseError(s.to_string()));
            }
            out[n] = u8::from_str_radix(part, 16).map_err(|_| MacParseError(s.to_string()))?;
            n += 1;
        }
        if n != 6 {
            return Err(MacParseError(s.to_string()));
        }
        Ok(MacAddr(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_round_trips() {
        let m: MacAddr = "02:ab:cd:ef:01:23".parse().unwrap();
        assert_eq!(MacAddr::from_u64(m.to_u64()), m);
        assert!("02:ab:cd:ef:01".parse::<MacAddr>().is_err());
        assert!("02:ab:cd:ef:01:2g".parse::<MacAddr>().is_err());
        assert!("02:ab:cd:ef:01:23:45".parse::<MacAddr>().is_err());
        assert!(MacAddr([1, 0, 0x5e, 0, 0, 1]).is_multicast());
    }
}
