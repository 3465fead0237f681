//! Sets of VLAN ids, as trunk ports list them (`0,100,200-299`, `all`).

use std::fmt;
use std::str::FromStr;

/// Largest valid VLAN id (4095 is reserved).
pub const VLAN_ID_MAX: u16 = 4094;

/// A set of VLAN IDs, 0 (untagged) to 4095, as a bitmap (boxed: specs and
/// replies that hold one stay small).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct VlanSet(Box<[u64; 64]>);

/// Why a VLAN list did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct VlanSetError(String);

impl VlanSet {
    /// The empty set.
    pub fn empty() -> VlanSet {
        VlanSet(Box::new([0; 64]))
    }

    /// Every VLAN, untagged included (`all`).
    pub fn all() -> VlanSet {
        let mut s = VlanSet(Box::new([u64::MAX; 64]));
        s.remove(4095);
        s
    }

    /// Adds `vid` (0..=4095).
    pub fn insert(&mut self, vid: u16) {
        let v = usize::from(vid & 0x0fff);
        self.0[v / 64] |= 1 << (v % 64);
    }

    fn remove(&mut self, vid: u16) {
        let v = usize::from(vid & 0x0fff);
        self.0[v / 64] &= !(1 << (v % 64));
    }

    /// Whether `vid` is in the set (bits above 12 are ignored).
    #[inline]
    pub fn contains(&self, vid: u16) -> bool {
        let v = usize::from(vid & 0x0fff);
        self.0[v / 64] & (1 << (v % 64)) != 0
    }

    /// Whether the set holds nothing.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The set as ranges, lowest first.
    pub fn ranges(&self) -> Vec<(u16, u16)> {
        let mut out: Vec<(u16, u16)> = Vec::new();
        for v in 0..=4095u16 {
            if !self.contains(v) {
                continue;
            }
            match out.last_mut() {
                Some((_, hi)) if *hi + 1 == v => *hi = v,
                _ => out.push((v, v)),
            }
        }
        out
    }
}

impl Default for VlanSet {
    fn default() -> VlanSet {
        VlanSet::empty()
    }
}

fn vid(s: &str) -> Result<u16, VlanSetError> {
    let v: u16 = s
        .trim()
        .parse()
        .map_err(|_| VlanSetError(format!("{s:?} is not a VLAN id")))?;
    if v > VLAN_ID_MAX {
        return Err(VlanSetError(format!(
            "{v} is not a VLAN id (0 for untagged, 1..={VLAN_ID_MAX})"
        )));
    }
    Ok(v)
}

impl FromStr for VlanSet {
    type Err = VlanSetError;

    /// `all`, or a comma-separated list of VLAN IDs and ranges such as
    /// `0,100,200-299` (0 stands for untagged frames).
    fn from_str(s: &str) -> Result<VlanSet, VlanSetError> {
        if s.trim() == "all" {
            return Ok(VlanSet::all());
        }
        let mut set = VlanSet::empty();
        for item in s.split(',') {
            let (lo, hi) = match item.split_once('-') {
                Some((a, b)) => (vid(a)?, vid(b)?),
                None => {
                    let v = vid(item)?;
                    (v, v)
                }
            };
            if lo > hi {
                return Err(VlanSetError(format!("{item:?}: the range is empty")));
            }
            for v in lo..=hi {
                set.insert(v);
            }
        }
        if set.is_empty() {
            return Err(VlanSetError("no VLAN given".into()));
        }
        Ok(set)
    }
}

impl fmt::Display for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == VlanSet::all() {
            return f.write_str("all");
        }
        let items: Vec<String> = self
            .ranges()
            .into_iter()
            .map(|(lo, hi)| {
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}-{hi}")
                }
            })
            .collect();
        f.write_str(&items.join(","))
    }
}

impl fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VlanSet({self})")
    }
}

impl serde::Serialize for VlanSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for VlanSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<VlanSet, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_print_canonically() {
        let s: VlanSet = "200, 100,300-302,0".parse().unwrap();
        assert_eq!(s.to_string(), "0,100,200,300-302");
        assert!(s.contains(301) && s.contains(0) && !s.contains(303));
        assert_eq!("all".parse::<VlanSet>().unwrap().to_string(), "all");
        assert!(VlanSet::all().contains(0) && VlanSet::all().contains(4094));
        assert!(!VlanSet::all().contains(4095));
        for bad in ["", "4095", "10-5", "x", "1,,2", "-3"] {
            assert!(bad.parse::<VlanSet>().is_err(), "{bad:?}");
        }
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, "\"0,100,200,300-302\"");
        assert_eq!(serde_json::from_str::<VlanSet>(&json).unwrap(), s);
    }
}
