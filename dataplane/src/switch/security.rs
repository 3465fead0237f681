//! Port security: what source addresses a port may use on its bridge.
//!
//! Three rules, as a CNI-managed switch can enforce them (VPP has learn
//! limits, OVN `port_security`):
//! - a **learning limit**: a port holds at most `mac_limit` entries in its
//!   bridge's MAC table; frames from further unknown sources are dropped
//!   (`mac_limit`), so a port spraying random source MACs cannot push the
//!   other ports' entries out;
//! - **pinning**: a port given its MACs (or told to pin the first it sends
//!   from) may only send from them (else `spoofed_source`); its entries are
//!   pinned in the table: they never age and never move to another port;
//! - **move protection**: an entry moves to another port only after it has
//!   been quiet for the bridge's hold time (else `mac_move`), so a port
//!   cannot take a neighbour's address by sending once with it.
//!
//! [`SecurityState`] is shared by the control thread and the workers; the
//! per-frame check is one branch for a port without a MAC filter.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::mac_table::{Learned, MacEntry, MacTable};
use crate::types::DropReason;
use crate::wire::MacAddr;

pub use switchyard_api::spec::DEFAULT_MAC_LIMIT;
/// Seconds an entry must be quiet before it may move to another port.
pub const DEFAULT_MOVE_HOLD_SECS: u32 = 5;

/// A port's security settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSecurity {
    /// Most MAC table entries the port may hold at once (0: no limit).
    pub mac_limit: u32,
    /// The source MACs the port may use, pinned to it (empty: any).
    pub macs: Vec<MacAddr>,
    /// Pin the first source MAC the port sends from (when `macs` is empty).
    pub pin_first: bool,
    /// Most frames a second the port may have flooded (0: no limit).
    pub flood_limit: u32,
}

impl Default for PortSecurity {
    fn default() -> Self {
        PortSecurity {
            mac_limit: DEFAULT_MAC_LIMIT,
            macs: Vec::new(),
            pin_first: false,
            flood_limit: 0,
        }
    }
}

impl PortSecurity {
    /// The settings a port spec asks for (after it validated).
    pub fn from_spec(spec: &switchyard_api::PortSpec) -> PortSecurity {
        PortSecurity {
            mac_limit: spec
                .mac_limit
                .unwrap_or_else(|| spec.kind.options().default_mac_limit()),
            macs: spec.macs.clone().unwrap_or_default(),
            pin_first: spec.pin_first.unwrap_or(false),
            // A pod's port (the CNI plugin's) is held to the default unless
            // its netconf says; others to what their spec says.
            flood_limit: spec.flood_limit.unwrap_or(if spec.pod.is_some() {
                switchyard_api::spec::DEFAULT_POD_FLOOD_LIMIT
            } else {
                0
            }),
        }
    }
}

/// Marks the `first` word as holding a MAC.
const FIRST_SET: u64 = 1 << 63;

/// A port's security settings and what they track at run time.
#[derive(Debug)]
pub struct SecurityState {
    /// `allowed` is not empty or `pin_first`: the one test a frame of a
    /// port without a MAC filter costs.
    filters: bool,
    limit: u32,
    /// `macs` as `u64`s.
    allowed: Box<[u64]>,
    pin_first: bool,
    /// With `pin_first`: the pinned MAC | [`FIRST_SET`], 0 until the first
    /// frame.
    first: AtomicU64,
    /// Entries the port holds in its bridge's MAC table.
    learned: AtomicU32,
    /// Most frames a second it may have flooded (0: no limit).
    flood_limit: u32,
}

impl SecurityState {
    /// State for `policy`.
    pub fn new(policy: &PortSecurity) -> SecurityState {
        let pin_first = policy.pin_first && policy.macs.is_empty();
        SecurityState {
            filters: pin_first || !policy.macs.is_empty(),
            limit: policy.mac_limit,
            allowed: policy.macs.iter().map(MacAddr::to_u64).collect(),
            pin_first,
            first: AtomicU64::new(0),
            learned: AtomicU32::new(0),
            flood_limit: policy.flood_limit,
        }
    }

    /// Entries the port holds in its bridge's table.
    pub fn learned(&self) -> u32 {
        self.learned.load(Ordering::Relaxed)
    }

    /// The limit (0: none).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Most frames a second it may have flooded (0: no limit).
    pub fn flood_limit(&self) -> u32 {
        self.flood_limit
    }

    /// Whether one more frame of the port may be flooded in second `now`,
    /// counting it in `window` (the calling worker's: the second it counts
    /// in, high half, and the frames flooded in it): one worker's floods
    /// are held to the limit, a fixed window a second as switches' storm
    /// control is. Only the calling worker writes `window`.
    /// Out of line: the forwarding loop stays small (a flood costs a copy
    /// per port anyway).
    #[inline(never)]
    pub fn may_flood(&self, window: &AtomicU64, now: u32) -> bool {
        if self.flood_limit == 0 {
            return true;
        }
        let w = window.load(Ordering::Relaxed);
        let used = if (w >> 32) as u32 == now { w as u32 } else { 0 };
        if used >= self.flood_limit {
            return false;
        }
        window.store(
            u64::from(now) << 32 | u64::from(used + 1),
            Ordering::Relaxed,
        );
        true
    }

    /// True when the port may only send from its pinned MACs.
    #[inline]
    pub fn filters_sources(&self) -> bool {
        self.filters
    }

    /// With `pin_first`, the MAC pinned by the port's first frame.
    pub fn first_pinned(&self) -> Option<MacAddr> {
        let v = self.first.load(Ordering::Acquire);
        (v & FIRST_SET != 0).then(|| MacAddr::from_u64(v))
    }

    /// Whether the port may send from `src`: `Ok(true)` when `src` is one
    /// of its pinned MACs (the first one seen becomes pinned with
    /// `pin_first`), `Ok(false)` when the port filters nothing.
    #[inline]
    pub fn check_source(&self, src: MacAddr) -> Result<bool, DropReason> {
        if !self.filters {
            return Ok(false);
        }
        if !self.allowed.is_empty() {
            let s = src.to_u64();
            return if self.allowed.contains(&s) {
                Ok(true)
            } else {
                Err(DropReason::SpoofedSource)
            };
        }
        if self.pin_first {
            let want = src.to_u64() | FIRST_SET;
            return match self
                .first
                .compare_exchange(0, want, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => Ok(true),
                Err(v) if v == want => Ok(true),
                Err(_) => Err(DropReason::SpoofedSource),
            };
        }
        Ok(false)
    }

    /// Takes a place for a new entry under the limit.
    #[inline]
    fn reserve(&self) -> bool {
        let n = self.learned.fetch_add(1, Ordering::Relaxed);
        if self.limit != 0 && n >= self.limit {
            self.learned.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Counts entries installed for the port by the control plane (pinned
    /// MACs), which the limit does not refuse.
    pub fn take(&self, n: u32) {
        self.learned.fetch_add(n, Ordering::Relaxed);
    }

    /// Gives back places of entries the port no longer holds.
    pub fn release(&self, n: u32) {
        if n > 0 {
            self.learned.fetch_sub(n, Ordering::Relaxed);
        }
    }
}

/// What [`admit_source`] did with an admitted source address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Known on this port, nothing written.
    Known,
    /// Known on this port, its age reset.
    Refreshed,
    /// Learned.
    New,
    /// Moved from another port (its entry, as it was).
    Moved(MacEntry),
    /// Learned by evicting another entry of a full bucket (that entry).
    Evicted(MacEntry),
    /// Forwarded but not learned: the bucket is full of pinned entries.
    NotLearned,
}

/// Learns `src` on `vlan` for the port of `entry` (whose security is
/// `sec`). `owner` finds the security state of another port's entry, to
/// give back the place of an entry this one displaced. `Err` is why the
/// frame must be dropped.
#[inline]
pub fn admit_source<'a>(
    macs: &MacTable,
    sec: &SecurityState,
    src: MacAddr,
    vlan: u16,
    mut entry: MacEntry,
    hold: u32,
    owner: impl Fn(&MacEntry) -> Option<&'a SecurityState>,
) -> Result<Admitted, DropReason> {
    entry.pinned = sec.check_source(src)?;
    // The usual case: the port's own entry, refreshed once a second.
    if let Some(e) = macs.lookup(src, vlan) {
        if e.same_port(&entry) {
            if e.last_seen != entry.last_seen || (entry.pinned && !e.pinned) {
                macs.learn(src, vlan, entry, hold);
                return Ok(Admitted::Refreshed);
            }
            return Ok(Admitted::Known);
        }
    }
    if !sec.reserve() {
        return Err(DropReason::MacLimit);
    }
    let release_other = |e: &MacEntry| {
        if let Some(s) = owner(e) {
            s.release(1);
        }
    };
    match macs.learn(src, vlan, entry, hold) {
        Learned::New => Ok(Admitted::New),
        Learned::Moved(old) => {
            release_other(&old);
            Ok(Admitted::Moved(old))
        }
        Learned::Evicted(old) => {
            release_other(&old);
            Ok(Admitted::Evicted(old))
        }
        // Another worker learned it on this port in the meantime.
        Learned::Unchanged | Learned::Refreshed => {
            sec.release(1);
            Ok(Admitted::Known)
        }
        Learned::Pinned(_) => {
            sec.release(1);
            Err(DropReason::SpoofedSource)
        }
        Learned::Held(_) => {
            sec.release(1);
            Err(DropReason::MacMove)
        }
        // Forwarded, not learned: replies to it are flooded.
        Learned::Full => {
            sec.release(1);
            Ok(Admitted::NotLearned)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::test_util::{entry as on, mac};

    #[test]
    fn a_port_holds_at_most_its_limit_and_others_keep_their_entries() {
        let t = MacTable::new(4096);
        let victim = SecurityState::new(&PortSecurity::default());
        let sprayer = SecurityState::new(&PortSecurity {
            mac_limit: 8,
            ..PortSecurity::default()
        });
        let owners = |e: &MacEntry| match e.port {
            1 => Some(&victim),
            2 => Some(&sprayer),
            _ => None,
        };
        admit_source(&t, &victim, mac(1), 0, on(1, 0), 5, owners).unwrap();
        let mut limited = 0;
        for i in 0..10_000 {
            match admit_source(&t, &sprayer, mac(1000 + i), 0, on(2, 1), 5, owners) {
                Ok(_) => {}
                Err(DropReason::MacLimit) => limited += 1,
                Err(r) => panic!("{r:?}"),
            }
        }
        assert_eq!(sprayer.learned(), 8);
        assert_eq!(limited, 10_000 - 8);
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 1);
        // Known sources still pass at the limit.
        admit_source(&t, &sprayer, mac(1000), 0, on(2, 2), 5, owners).unwrap();
        // Aging gives the places back.
        t.age(100, 10, |r| owners(&r.entry).unwrap().release(1));
        assert_eq!((victim.learned(), sprayer.learned()), (0, 0));
    }

    #[test]
    fn pinned_macs_filter_sources_and_cannot_be_taken() {
        let t = MacTable::new(1024);
        let pod = SecurityState::new(&PortSecurity {
            macs: vec![mac(1)],
            ..PortSecurity::default()
        });
        let other = SecurityState::new(&PortSecurity::default());
        let owners = |e: &MacEntry| match e.port {
            1 => Some(&pod),
            _ => Some(&other),
        };
        assert_eq!(
            admit_source(&t, &pod, mac(2), 0, on(1, 0), 5, owners),
            Err(DropReason::SpoofedSource)
        );
        admit_source(&t, &pod, mac(1), 0, on(1, 0), 5, owners).unwrap();
        assert!(t.lookup(mac(1), 0).unwrap().pinned);
        // Quiet for ever: still not movable.
        assert_eq!(
            admit_source(&t, &other, mac(1), 0, on(2, 1000), 5, owners),
            Err(DropReason::SpoofedSource)
        );
        assert_eq!(other.learned(), 0);
    }

    #[test]
    fn pin_first_pins_the_first_source() {
        let t = MacTable::new(1024);
        let pod = SecurityState::new(&PortSecurity {
            pin_first: true,
            ..PortSecurity::default()
        });
        let owners = |_: &MacEntry| Some(&pod);
        assert_eq!(pod.first_pinned(), None);
        admit_source(&t, &pod, mac(7), 0, on(1, 0), 5, owners).unwrap();
        assert_eq!(pod.first_pinned(), Some(mac(7)));
        assert_eq!(
            admit_source(&t, &pod, mac(8), 0, on(1, 0), 5, owners),
            Err(DropReason::SpoofedSource)
        );
        assert!(t.lookup(mac(7), 0).unwrap().pinned);
    }

    #[test]
    fn a_neighbours_fresh_address_is_not_taken_by_one_frame() {
        let t = MacTable::new(1024);
        let a = SecurityState::new(&PortSecurity::default());
        let thief = SecurityState::new(&PortSecurity::default());
        let owners = |e: &MacEntry| Some(if e.port == 1 { &a } else { &thief });
        assert_eq!(
            admit_source(&t, &a, mac(1), 0, on(1, 100), 5, owners),
            Ok(Admitted::New)
        );
        assert_eq!(
            admit_source(&t, &a, mac(1), 0, on(1, 100), 5, owners),
            Ok(Admitted::Known)
        );
        assert_eq!(
            admit_source(&t, &thief, mac(1), 0, on(2, 102), 5, owners),
            Err(DropReason::MacMove)
        );
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 1);
        // Quiet for the hold time: the address moves (a VM migrated).
        assert_eq!(
            admit_source(&t, &thief, mac(1), 0, on(2, 105), 5, owners),
            Ok(Admitted::Moved(on(1, 100)))
        );
        assert_eq!(t.lookup(mac(1), 0).unwrap().port, 2);
        assert_eq!((a.learned(), thief.learned()), (0, 1));
    }
}
