//! The switch's tables: the MAC table of each bridge domain and the
//! per-port security state that guards it. Plain data structures, shared by
//! the control thread (which creates, ages and flushes them) and the
//! workers (which learn and look up, lock-free); the forwarding that uses
//! them is [`crate::forward`].

pub mod mac_table;
pub mod neigh;
pub mod police;
pub mod policy;
pub mod security;

/// What the tables' and port security's tests share.
#[cfg(test)]
pub(crate) mod test_util {
    use super::mac_table::MacEntry;
    use crate::wire::MacAddr;

    /// Station address number `i`.
    pub fn mac(i: u64) -> MacAddr {
        MacAddr::from_u64(0x0200_0000_0000 | i)
    }

    /// An entry on `port`, last seen at `t`.
    pub fn entry(port: u16, t: u32) -> MacEntry {
        MacEntry {
            port,
            port_gen: 1,
            last_seen: t,
            pinned: false,
        }
    }
}
