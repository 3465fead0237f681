//! The switch's tables: the MAC table of each bridge domain and the
//! per-port security state that guards it. Plain data structures, shared by
//! the control thread (which creates, ages and flushes them) and the
//! workers (which learn and look up, lock-free); the forwarding that uses
//! them is [`crate::forward`].

pub mod mac_table;
pub mod security;
