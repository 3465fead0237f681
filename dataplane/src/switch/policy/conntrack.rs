//! Connection tracking for L3/L4 policy: the connections a policy allowed,
//! so that their further packets and their replies pass without being
//! judged again, as the kernel's conntrack lets `ESTABLISHED,RELATED`
//! through an iptables policy.
//!
//! One table for the switch, in shards each under its own lock (a lookup
//! holds one shard's lock for a hash probe), keyed by the connection's
//! zone (bridge and VLAN), protocol, and its two ends in a canonical order,
//! hashed with a random key (a pod cannot aim its flows at one bucket).
//! An entry remembers which end opened it and the two ports its first
//! packet went between: a packet of the connection matches only coming in
//! where its direction did and going where it went (a connection opened
//! towards one port is nobody else's), and its replies the other way.
//! A port is named with its slot's generation ([`PortRef`]): a connection
//! through a removed port is never that of the port next in its slot.
//!
//! Bounded: each entry is charged to a port's quota ([`CtQuota`]: the
//! station's whose connection it is, as the caller picks); a port holding
//! its share ([`PORT_SHARE`]) opens no more until some expire, and the
//! table holds [`TABLE_LIMIT`] at most. Timeouts are the kernel's defaults
//! (`nf_conntrack_tcp_timeout_*`, `nf_conntrack_udp_timeout*`,
//! `nf_conntrack_icmp_timeout`, `nf_conntrack_generic_timeout`); TCP's
//! states are followed as far as timeouts need them (SYN, SYN-ACK, FIN
//! both ways, RST), a connection met mid-stream is taken up as established
//! (`nf_conntrack_tcp_loose`, on by default).

use std::collections::hash_map::{Entry, HashMap, RandomState};
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::types::PortId;
use crate::wire::flow::{tcp_flags, Tuple, PROTO_ICMP, PROTO_ICMPV6, PROTO_SCTP};
use crate::wire::ip::{PROTO_TCP, PROTO_UDP};
use crate::wire::MacAddr;

/// Most entries the table holds.
pub const TABLE_LIMIT: u32 = 262_144;
/// Most entries the connections opened from one port may hold.
pub const PORT_SHARE: u32 = 16_384;
/// Shards of the table, each under its own lock.
pub const SHARDS: usize = 64;

/// Seconds, as the kernel's defaults.
mod timeout {
    pub const TCP_SYN_SENT: u32 = 120;
    pub const TCP_SYN_RECV: u32 = 60;
    pub const TCP_ESTABLISHED: u32 = 432_000;
    pub const TCP_FIN_WAIT: u32 = 120;
    pub const TCP_TIME_WAIT: u32 = 120;
    pub const TCP_CLOSE: u32 = 10;
    pub const UDP: u32 = 30;
    pub const UDP_STREAM: u32 = 120;
    pub const ICMP: u32 = 30;
    /// SCTP's established (`nf_conntrack_sctp_timeout_established`); its
    /// handshake as UDP's unreplied.
    pub const SCTP_ESTABLISHED: u32 = 210;
    pub const GENERIC: u32 = 600;
}

/// A port as a connection names it: its slot and the slot's generation
/// (as MAC entries carry it), so that a connection through a port that
/// was removed matches no port given its slot afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRef {
    /// The port's slot.
    pub id: PortId,
    /// The slot's generation.
    pub generation: u16,
}

/// The connections charged to a port: what they hold of the table.
#[derive(Debug, Default)]
pub struct CtQuota {
    held: AtomicU32,
}

impl CtQuota {
    /// Entries held.
    pub fn held(&self) -> u32 {
        self.held.load(Ordering::Relaxed)
    }
}

/// Where a connection lives: its bridge and the VLAN inside it.
pub type Zone = u32;

/// The zone of VLAN `domain` of bridge `bridge`.
pub fn zone(bridge: u16, domain: u16) -> Zone {
    u32::from(bridge) << 16 | u32::from(domain)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    zone: Zone,
    v6: bool,
    proto: u8,
    lo: (u128, u16),
    hi: (u128, u16),
    /// Its hash under the table's seed, made once: it picks the shard and
    /// the bucket.
    hash: u64,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash);
    }
}

/// The hasher of a shard's map: the key's own hash, as made.
#[derive(Default)]
struct Made(u64);

impl Hasher for Made {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("keys hash as one u64")
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// A folded multiply: the high and low halves of the 128-bit product,
/// XORed (foldhash's and aHash's mixing step).
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

impl Key {
    /// The key of `t`'s connection, and whether `t` goes from `lo` to `hi`;
    /// hashed with `seed`.
    fn of(zone: Zone, t: &Tuple, seed: &[u64; 2]) -> (Key, bool) {
        let a = (t.src, t.sport);
        let b = (t.dst, t.dport);
        let up = a <= b;
        let (lo, hi) = if up { (a, b) } else { (b, a) };
        // Seeded, so that a pod cannot make its connections collide (the
        // seed is random per switch and never shown).
        let words = [
            lo.0 as u64,
            (lo.0 >> 64) as u64,
            hi.0 as u64,
            (hi.0 >> 64) as u64,
            u64::from(lo.1)
                | u64::from(hi.1) << 16
                | u64::from(t.proto) << 32
                | u64::from(t.v6) << 40,
            u64::from(zone),
        ];
        let mut h = seed[0];
        for w in words {
            h = fold(h ^ w, seed[1] | 1);
        }
        (
            Key {
                zone,
                v6: t.v6,
                proto: t.proto,
                lo,
                hi,
                hash: h,
            },
            up,
        )
    }
}

/// What a connection's packets have shown, as far as its timeout needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CtState {
    /// TCP: the opening SYN, unanswered.
    SynSent,
    /// TCP: SYN-ACK seen.
    SynRecv,
    /// TCP: open.
    Established,
    /// TCP: FIN from one end.
    FinWait,
    /// TCP: FIN from both ends.
    TimeWait,
    /// TCP: reset.
    Close,
    /// Another protocol, no reply yet.
    Unreplied,
    /// Another protocol, replied.
    Replied,
}

#[derive(Debug)]
struct Conn {
    /// The opening end is the key's `lo`.
    opened_by_lo: bool,
    state: CtState,
    /// FIN seen from the opening end, from the other.
    fin: (bool, bool),
    expires: u32,
    /// The port its first packet came in on and the one it went to: its
    /// replies come in on the second and go to the first.
    ports: (PortRef, PortRef),
    /// The source MAC of its opening end, as the bridge had it on the
    /// port its first packet came in on: where that end may move
    /// ([`Conntrack::open`]).
    mac: Option<MacAddr>,
    owner: Arc<CtQuota>,
}

impl Conn {
    /// Where a packet of it in the opening direction (`orig`) or the
    /// reply's comes in, and where it goes.
    fn way(&self, orig: bool) -> (PortRef, PortRef) {
        if orig {
            self.ports
        } else {
            (self.ports.1, self.ports.0)
        }
    }

    fn live(&self, now: u32) -> bool {
        self.expires > now && !matches!(self.state, CtState::TimeWait | CtState::Close)
    }
}

/// A connection as a takeover hands it over ([`Conntrack::export`],
/// [`Conntrack::import`]): its ports by name, its time as what is left.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnRecord {
    /// The VLAN inside its bridge.
    pub vlan: u16,
    /// IP protocol.
    pub proto: u8,
    /// One end (the lower) and its port.
    pub a: (std::net::IpAddr, u16),
    /// The other end.
    pub b: (std::net::IpAddr, u16),
    /// `a` opened it.
    pub opened_by_a: bool,
    /// Its state.
    pub state: CtState,
    /// FIN seen from the end that opened it, from the other.
    pub fin: (bool, bool),
    /// Seconds until it expires.
    pub left: u32,
    /// The port its first packet came in on.
    pub orig_port: String,
    /// The port its first packet went to, where its replies come in (a
    /// record without it is not taken up).
    pub reply_port: Option<String>,
    /// The port it is charged to.
    pub owner: String,
    /// The source MAC of the end that opened it, where it may move (an
    /// older switch's record has none: its opener stays where it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<MacAddr>,
}

fn ip_of(v6: bool, a: u128) -> std::net::IpAddr {
    if v6 {
        std::net::IpAddr::V6(a.into())
    } else {
        std::net::IpAddr::V4((a as u32).into())
    }
}

fn bits_of(a: std::net::IpAddr) -> u128 {
    match a {
        std::net::IpAddr::V4(v) => u128::from(u32::from(v)),
        std::net::IpAddr::V6(v) => u128::from(v),
    }
}

/// Why a new connection was not recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The opening port holds its share.
    Port,
    /// The table holds its limit.
    Table,
}

/// The table.
pub struct Conntrack {
    shards: Box<[Mutex<Shard>]>,
    seed: [u64; 2],
    total: AtomicU32,
    /// The next shard [`Conntrack::sweep_part`] sweeps.
    cursor: AtomicUsize,
    table_limit: u32,
    port_share: u32,
}

impl Default for Conntrack {
    fn default() -> Self {
        Conntrack::new(TABLE_LIMIT, PORT_SHARE)
    }
}

impl std::fmt::Debug for Conntrack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conntrack")
            .field("entries", &self.len())
            .finish_non_exhaustive()
    }
}

type Shard = HashMap<Key, Conn, BuildHasherDefault<Made>>;

fn is_tcp(proto: u8) -> bool {
    proto == PROTO_TCP
}

/// The state a new connection starts in, from its first packet.
fn opening_state(proto: u8, flags: u8) -> CtState {
    if !is_tcp(proto) {
        return CtState::Unreplied;
    }
    if flags & tcp_flags::RST != 0 {
        CtState::Close
    } else if flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN {
        CtState::SynSent
    } else if flags & tcp_flags::SYN != 0 {
        CtState::SynRecv
    } else {
        // Taken up mid-stream.
        CtState::Established
    }
}

fn timeout_of(proto: u8, state: CtState) -> u32 {
    match state {
        CtState::SynSent => timeout::TCP_SYN_SENT,
        CtState::SynRecv => timeout::TCP_SYN_RECV,
        CtState::Established => timeout::TCP_ESTABLISHED,
        CtState::FinWait => timeout::TCP_FIN_WAIT,
        CtState::TimeWait => timeout::TCP_TIME_WAIT,
        CtState::Close => timeout::TCP_CLOSE,
        CtState::Unreplied => match proto {
            PROTO_ICMP | PROTO_ICMPV6 => timeout::ICMP,
            PROTO_UDP | PROTO_SCTP => timeout::UDP,
            _ => timeout::GENERIC,
        },
        CtState::Replied => match proto {
            PROTO_ICMP | PROTO_ICMPV6 => timeout::ICMP,
            PROTO_UDP => timeout::UDP_STREAM,
            PROTO_SCTP => timeout::SCTP_ESTABLISHED,
            _ => timeout::GENERIC,
        },
    }
}

impl Conn {
    /// Moves the state on for a packet with TCP `flags` in the opening
    /// direction (`orig`) or the reply's, at `now`.
    fn advance(&mut self, proto: u8, orig: bool, flags: u8, now: u32) {
        use CtState::*;
        self.state = if !is_tcp(proto) {
            if orig {
                self.state
            } else {
                Replied
            }
        } else if flags & tcp_flags::RST != 0 {
            Close
        } else {
            if flags & tcp_flags::FIN != 0 {
                if orig {
                    self.fin.0 = true;
                } else {
                    self.fin.1 = true;
                }
            }
            match self.state {
                SynSent if !orig && flags & tcp_flags::SYN != 0 => SynRecv,
                SynRecv if orig && flags & tcp_flags::ACK != 0 => Established,
                s @ (SynSent | SynRecv) => s,
                Close => Close,
                _ if self.fin.0 && self.fin.1 => TimeWait,
                _ if self.fin.0 || self.fin.1 => FinWait,
                s => s,
            }
        };
        self.expires = now.saturating_add(timeout_of(proto, self.state));
    }
}

impl Conntrack {
    /// A table of `table_limit` entries at most, `port_share` per opening
    /// port.
    pub fn new(table_limit: u32, port_share: u32) -> Conntrack {
        // std's random keys (from the OS), as the seed.
        let random = RandomState::new();
        let seed = [random.hash_one(0u64), random.hash_one(1u64)];
        Conntrack {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            seed,
            total: AtomicU32::new(0),
            cursor: AtomicUsize::new(0),
            table_limit,
            port_share,
        }
    }

    /// Entries held.
    pub fn len(&self) -> u32 {
        self.total.load(Ordering::Relaxed)
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, k: &Key) -> std::sync::MutexGuard<'_, Shard> {
        // The high bits (the map's buckets take the low ones).
        let i = (k.hash >> 58) as usize % SHARDS;
        // A worker that panicked holding it left a map that is still whole.
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release(&self, c: &Conn) {
        c.owner.held.fetch_sub(1, Ordering::Relaxed);
        self.total.fetch_sub(1, Ordering::Relaxed);
    }

    /// Looks packet `t` (TCP `flags`) up as it came in on port `from` in
    /// `zone` at `now`: if it is a packet of a known connection coming in
    /// where its direction does, moves the connection's state on and
    /// returns the port its direction goes to (it is established there
    /// alone); else `None` (policy judges it as a new connection).
    pub fn track(
        &self,
        zone: Zone,
        t: &Tuple,
        flags: u8,
        from: PortRef,
        now: u32,
    ) -> Option<PortRef> {
        let (key, up) = Key::of(zone, t, &self.seed);
        let mut map = self.shard(&key);
        let c = map.get_mut(&key)?;
        if c.expires <= now {
            let c = map.remove(&key).expect("present");
            self.release(&c);
            return None;
        }
        let orig = up == c.opened_by_lo;
        // A SYN opening the connection again after it closed is a new one.
        if orig
            && is_tcp(t.proto)
            && matches!(c.state, CtState::TimeWait | CtState::Close)
            && flags & (tcp_flags::SYN | tcp_flags::ACK) == tcp_flags::SYN
        {
            return None;
        }
        let (at, to) = c.way(orig);
        if at != from {
            return None;
        }
        c.advance(t.proto, orig, flags, now);
        Some(to)
    }

    /// Records the new connection packet `t` (TCP `flags`) opens, going
    /// from port `from` to port `to` (charged to `owner`) at `now`; `src`:
    /// the packet's source MAC if the bridge has it on `from` (learned
    /// there). A connection that closed or expired, or names an earlier
    /// port of the slot of `from` or `to`, is replaced. A live one moves to
    /// the new way only if the packet came in where its direction does
    /// (its destination moved), or, in its opening direction towards the
    /// same port, if its opening end's MAC is now on `from` (the bridge
    /// moved it there: a station that migrated, behind another tunnel,
    /// say): no other port, judged or not, takes a connection from its
    /// ports.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &self,
        zone: Zone,
        t: &Tuple,
        flags: u8,
        (from, to): (PortRef, PortRef),
        src: Option<MacAddr>,
        owner: &Arc<CtQuota>,
        now: u32,
    ) -> Result<(), Full> {
        let (key, up) = Key::of(zone, t, &self.seed);
        let mut map = self.shard(&key);
        let state = opening_state(t.proto, flags);
        let conn = Conn {
            opened_by_lo: up,
            state,
            fin: (false, false),
            expires: now.saturating_add(timeout_of(t.proto, state)),
            ports: (from, to),
            mac: src,
            owner: owner.clone(),
        };
        match map.entry(key) {
            Entry::Occupied(mut e) => {
                let c = e.get_mut();
                let orig = up == c.opened_by_lo;
                let (at, went) = c.way(orig);
                // A port removed since (a worker still on a view with it
                // recorded this after it was forgotten).
                let earlier = |p: PortRef| {
                    [from, to]
                        .iter()
                        .any(|q| q.id == p.id && q.generation != p.generation)
                };
                if c.live(now) && !earlier(at) && !earlier(went) {
                    if at == from && went == to {
                        return Ok(());
                    }
                    if at != from {
                        // Its opener, moved: the same connection.
                        if orig && went == to && src.is_some() && src == c.mac {
                            c.ports.0 = from;
                            c.advance(t.proto, orig, flags, now);
                        }
                        return Ok(());
                    }
                    // Its destination moved: opened anew there.
                }
                // Replaced: the new connection is charged afresh.
                if owner.held.load(Ordering::Relaxed) >= self.port_share
                    && !Arc::ptr_eq(owner, &c.owner)
                {
                    return Err(Full::Port);
                }
                let old = e.insert(conn);
                old.owner.held.fetch_sub(1, Ordering::Relaxed);
                owner.held.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Entry::Vacant(v) => {
                if owner.held.load(Ordering::Relaxed) >= self.port_share {
                    return Err(Full::Port);
                }
                if self.total.load(Ordering::Relaxed) >= self.table_limit {
                    return Err(Full::Table);
                }
                owner.held.fetch_add(1, Ordering::Relaxed);
                self.total.fetch_add(1, Ordering::Relaxed);
                v.insert(conn);
                Ok(())
            }
        }
    }

    /// Whether an ICMP error coming in on port `from` quotes (`about`, as
    /// it went) a packet of a connection the table holds, coming back from
    /// where that packet went: returns the port the packet came from, the
    /// one port the error is related to.
    pub fn related(&self, zone: Zone, about: &Tuple, from: PortRef, now: u32) -> Option<PortRef> {
        let (key, up) = Key::of(zone, about, &self.seed);
        let map = self.shard(&key);
        let c = map.get(&key).filter(|c| c.expires > now)?;
        let (came, went) = c.way(up == c.opened_by_lo);
        (went == from).then_some(came)
    }

    /// Forgets the connections that expired by `now`; returns how many.
    pub fn sweep(&self, now: u32) -> usize {
        self.sweep_part(now, SHARDS)
    }

    /// [`Conntrack::sweep`] for the next `shards` of its shards in turn
    /// (a control tick sweeps a part, holding each shard's lock a short
    /// while).
    pub fn sweep_part(&self, now: u32, shards: usize) -> usize {
        let mut n = 0;
        for _ in 0..shards.min(SHARDS) {
            let i = self.cursor.fetch_add(1, Ordering::Relaxed) % SHARDS;
            let mut map = self.shards[i].lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|_, c| {
                let keep = c.expires > now;
                if !keep {
                    self.release(c);
                    n += 1;
                }
                keep
            });
        }
        n
    }

    /// Forgets the connections through port `port` (removed: they would
    /// match no port again, but hold their share of the table until they
    /// expire); returns how many.
    pub fn forget_port(&self, port: PortRef) -> usize {
        let mut n = 0;
        for s in self.shards.iter() {
            let mut map = s.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|_, c| {
                let keep = c.ports.0 != port && c.ports.1 != port;
                if !keep {
                    self.release(c);
                    n += 1;
                }
                keep
            });
        }
        n
    }

    /// The connections of bridge `bridge` alive at `now`, for a takeover:
    /// `port` names a port slot, `owner` the port a quota is charged to
    /// (a connection whose ports are gone is left out).
    pub fn export(
        &self,
        bridge: u16,
        now: u32,
        port: impl Fn(PortRef) -> Option<String>,
        owner: impl Fn(&Arc<CtQuota>) -> Option<String>,
    ) -> Vec<ConnRecord> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let map = s.lock().unwrap_or_else(|e| e.into_inner());
            for (k, c) in map.iter() {
                if (k.zone >> 16) as u16 != bridge || c.expires <= now {
                    continue;
                }
                let (Some(orig_port), Some(reply_port), Some(owner)) =
                    (port(c.ports.0), port(c.ports.1), owner(&c.owner))
                else {
                    continue;
                };
                out.push(ConnRecord {
                    vlan: k.zone as u16,
                    proto: k.proto,
                    a: (ip_of(k.v6, k.lo.0), k.lo.1),
                    b: (ip_of(k.v6, k.hi.0), k.hi.1),
                    opened_by_a: c.opened_by_lo,
                    state: c.state,
                    fin: c.fin,
                    left: c.expires - now,
                    orig_port,
                    reply_port: Some(reply_port),
                    owner,
                    mac: c.mac,
                });
            }
        }
        out
    }

    /// Takes up connections a takeover handed over into bridge `bridge`
    /// at `now`: `port` finds a port by name (its slot, the share of the
    /// connections it opened and the share of those opened towards it);
    /// one whose ports are not there, or that does not fit, is left out.
    /// A connection is charged to its owner's first share if the owner is
    /// the port it came in on, else to the second. Returns how many were
    /// taken.
    pub fn import(
        &self,
        bridge: u16,
        now: u32,
        records: &[ConnRecord],
        port: impl Fn(&str) -> Option<(PortRef, Arc<CtQuota>, Arc<CtQuota>)>,
    ) -> usize {
        let mut n = 0;
        for r in records {
            let (Some((orig, ..)), Some((_, own, given))) = (port(&r.orig_port), port(&r.owner))
            else {
                continue;
            };
            let owner = if r.owner == r.orig_port { own } else { given };
            let Some((reply, ..)) = r.reply_port.as_deref().and_then(&port) else {
                continue;
            };
            if r.a.0.is_ipv6() != r.b.0.is_ipv6() {
                continue;
            }
            let t = Tuple {
                v6: r.a.0.is_ipv6(),
                proto: r.proto,
                src: bits_of(r.a.0),
                dst: bits_of(r.b.0),
                sport: r.a.1,
                dport: r.b.1,
            };
            let (key, up) = Key::of(zone(bridge, r.vlan), &t, &self.seed);
            if owner.held.load(Ordering::Relaxed) >= self.port_share
                || self.total.load(Ordering::Relaxed) >= self.table_limit
            {
                continue;
            }
            let conn = Conn {
                // `a` as given is the key's `lo` when it sorts first.
                opened_by_lo: r.opened_by_a == up,
                state: r.state,
                fin: r.fin,
                expires: now.saturating_add(r.left),
                ports: (orig, reply),
                mac: r.mac,
                owner: owner.clone(),
            };
            let mut map = self.shard(&key);
            if map.contains_key(&key) {
                continue;
            }
            owner.held.fetch_add(1, Ordering::Relaxed);
            self.total.fetch_add(1, Ordering::Relaxed);
            map.insert(key, conn);
            n += 1;
        }
        n
    }

    /// The state of `t`'s connection, if held (tests, `policy show`).
    pub fn state(&self, zone: Zone, t: &Tuple) -> Option<CtState> {
        let (key, _) = Key::of(zone, t, &self.seed);
        self.shard(&key).get(&key).map(|c| c.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcp_flags::*;

    /// Port `id` in its slot's first generation.
    fn p(id: PortId) -> PortRef {
        PortRef { id, generation: 1 }
    }

    fn tcp(sport: u16, dport: u16) -> Tuple {
        Tuple {
            v6: false,
            proto: PROTO_TCP,
            src: 0x0a00_0001,
            dst: 0x0a00_0002,
            sport,
            dport,
        }
    }

    #[test]
    fn a_tcp_connection_is_followed_through_its_states() {
        let ct = Conntrack::default();
        let q = Arc::new(CtQuota::default());
        let t = tcp(40000, 80);
        let z = zone(0, 0);
        assert_eq!(ct.track(z, &t, SYN, p(1), 0), None);
        ct.open(z, &t, SYN, (p(1), p(2)), None, &q, 0).unwrap();
        assert_eq!(ct.state(z, &t), Some(CtState::SynSent));
        // The reply, from the port the SYN went to, back to the first.
        assert_eq!(ct.track(z, &t.reversed(), SYN | ACK, p(2), 1), Some(p(1)));
        assert_eq!(ct.track(z, &t, ACK, p(1), 1), Some(p(2)));
        assert_eq!(ct.state(z, &t), Some(CtState::Established));
        // The opening direction from another port, or the reply from a
        // third: not this connection's packets.
        assert_eq!(ct.track(z, &t, ACK, p(3), 1), None);
        assert_eq!(ct.track(z, &t.reversed(), ACK, p(3), 1), None);
        // Another zone: another connection.
        assert_eq!(ct.track(zone(0, 5), &t, ACK, p(1), 1), None);
        ct.track(z, &t, FIN | ACK, p(1), 2);
        assert_eq!(ct.state(z, &t), Some(CtState::FinWait));
        ct.track(z, &t.reversed(), FIN | ACK, p(2), 2);
        assert_eq!(ct.state(z, &t), Some(CtState::TimeWait));
        // A new SYN on the closed connection opens a new one.
        assert_eq!(ct.track(z, &t, SYN, p(1), 3), None);
        ct.open(z, &t, SYN, (p(1), p(2)), None, &q, 3).unwrap();
        assert_eq!(ct.state(z, &t), Some(CtState::SynSent));
        assert_eq!((ct.len(), q.held()), (1, 1));
        // Unanswered, it expires after the kernel's 120 s.
        assert_eq!(ct.track(z, &t, SYN, p(1), 3 + 119), Some(p(2)));
        assert_eq!(ct.track(z, &t, SYN, p(1), 3 + 119 + 120), None);
        assert_eq!((ct.len(), q.held()), (0, 0));
    }

    #[test]
    fn a_connection_is_its_two_ports_and_moves_only_when_allowed_anew() {
        let ct = Conntrack::default();
        let q = Arc::new(CtQuota::default());
        let t = tcp(40000, 80);
        // Opened towards port 3 (a flood's first member, say).
        ct.open(0, &t, SYN, (p(1), p(3)), None, &q, 0).unwrap();
        // Established there, and nowhere else: the caller compares.
        assert_eq!(ct.track(0, &t, ACK, p(1), 1), Some(p(3)));
        // Nor do replies from port 2 belong to it.
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(2), 1), None);
        // The same packet, from the same port, allowed towards port 2: it
        // moves.
        ct.open(0, &t, ACK, (p(1), p(2)), None, &q, 1).unwrap();
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(2), 2), Some(p(1)));
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(3), 2), None);
        // Opened again the same way (another worker's race): left.
        ct.open(0, &t, ACK, (p(1), p(2)), None, &q, 2).unwrap();
        // The same tuple from port 4 (a third party that knows it): the
        // connection stays where it is.
        ct.open(0, &t, ACK, (p(4), p(1)), None, &q, 2).unwrap();
        ct.open(0, &t, ACK, (p(4), p(2)), None, &q, 2).unwrap();
        assert_eq!(ct.track(0, &t, ACK, p(1), 2), Some(p(2)));
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(2), 2), Some(p(1)));
        assert_eq!((ct.len(), q.held()), (1, 1));
        // The port next in port 2's slot is not port 2.
        let next = PortRef {
            id: 2,
            generation: 2,
        };
        assert_eq!(ct.track(0, &t.reversed(), ACK, next, 2), None);
        assert_eq!(ct.related(0, &t, next, 2), None);
        // A port removed takes its connections with it.
        assert_eq!(ct.forget_port(p(2)), 1);
        assert_eq!((ct.len(), q.held()), (0, 0));
    }

    #[test]
    fn the_opening_end_moves_where_the_bridge_moved_its_mac() {
        let ct = Conntrack::default();
        let q = Arc::new(CtQuota::default());
        let t = tcp(40000, 80);
        let (client, other) = (
            Some(MacAddr([2, 0, 0, 0, 0, 1])),
            Some(MacAddr([2, 0, 0, 0, 0, 9])),
        );
        // A client behind tunnel 5 opens a connection to pod 1.
        ct.open(0, &t, SYN, (p(5), p(1)), client, &q, 0).unwrap();
        ct.track(0, &t.reversed(), SYN | ACK, p(1), 0);
        ct.track(0, &t, ACK, p(5), 0);
        // Another station behind port 7 sends the tuple, to pod 1 or to
        // pod 2: nothing moves.
        ct.open(0, &t, ACK, (p(7), p(1)), other, &q, 1).unwrap();
        ct.open(0, &t, ACK, (p(7), p(2)), client, &q, 1).unwrap();
        // Nor from where the bridge does not have the client's MAC.
        ct.open(0, &t, ACK, (p(7), p(1)), None, &q, 1).unwrap();
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(1), 1), Some(p(5)));
        // The client migrates behind tunnel 6 (its MAC moved there): the
        // connection follows, in its state, so the pod's replies do.
        assert_eq!(ct.track(0, &t, ACK, p(6), 2), None);
        ct.open(0, &t, ACK, (p(6), p(1)), client, &q, 2).unwrap();
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(1), 2), Some(p(6)));
        assert_eq!(ct.track(0, &t, ACK, p(6), 2), Some(p(1)));
        assert_eq!(ct.track(0, &t, ACK, p(5), 2), None);
        assert_eq!(ct.state(0, &t), Some(CtState::Established));
        // The pod's end does not move that way: a reply-direction packet
        // from elsewhere takes nothing.
        ct.open(0, &t.reversed(), ACK, (p(7), p(6)), client, &q, 2)
            .unwrap();
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(1), 2), Some(p(6)));
        assert_eq!((ct.len(), q.held()), (1, 1));
        // Recorded through a port since removed (slot 6's next port sends
        // it): replaced, not left in the way.
        let next6 = PortRef {
            id: 6,
            generation: 2,
        };
        ct.open(0, &t, SYN, (next6, p(1)), other, &q, 3).unwrap();
        assert_eq!(ct.track(0, &t.reversed(), ACK, p(1), 3), Some(next6));
        assert_eq!((ct.len(), q.held()), (1, 1));
    }

    #[test]
    fn udp_is_replied_and_expires_and_icmp_errors_are_related() {
        let ct = Conntrack::default();
        let q = Arc::new(CtQuota::default());
        let t = Tuple {
            proto: PROTO_UDP,
            ..tcp(5000, 53)
        };
        let z = zone(1, 0);
        ct.open(z, &t, 0, (p(1), p(2)), None, &q, 10).unwrap();
        // An error about the request comes back from port 2, to port 1;
        // about the reply, from port 1 to port 2.
        assert_eq!(ct.related(z, &t, p(2), 11), Some(p(1)));
        assert_eq!(ct.related(z, &t, p(1), 11), None);
        assert_eq!(ct.related(z, &t.reversed(), p(1), 11), Some(p(2)));
        assert_eq!(ct.track(z, &t.reversed(), 0, p(2), 20), Some(p(1)));
        assert_eq!(ct.state(z, &t), Some(CtState::Replied));
        assert_eq!(ct.track(z, &t, 0, p(1), 20 + 119), Some(p(2)));
        assert_eq!(ct.sweep(20 + 119 + 120), 1);
        assert!(ct.is_empty() && q.held() == 0);
        assert_eq!(ct.related(z, &t, p(2), 300), None);
    }

    #[test]
    fn connections_are_handed_over_with_their_ports_state_and_time() {
        let old = Conntrack::default();
        let q = Arc::new(CtQuota::default());
        let t = tcp(40000, 80);
        let z = zone(3, 7);
        old.open(z, &t, SYN, (p(1), p(2)), None, &q, 100).unwrap();
        old.track(z, &t.reversed(), SYN | ACK, p(2), 101);
        old.track(z, &t, ACK, p(1), 101);
        // Another bridge's: not in this bridge's export.
        old.open(zone(4, 0), &tcp(1, 2), SYN, (p(1), p(2)), None, &q, 100)
            .unwrap();
        let names = |r: PortRef| Some(format!("p{}", r.id));
        let recs = old.export(3, 110, names, |_| Some("p1".into()));
        assert_eq!(recs.len(), 1);
        assert_eq!(
            (recs[0].state, recs[0].left),
            (CtState::Established, 432_000 - 9)
        );
        // Through JSON, as a takeover sends it.
        let mut recs: Vec<ConnRecord> =
            serde_json::from_str(&serde_json::to_string(&recs).unwrap()).unwrap();
        // The new switch: other slots, another clock, bridge 0.
        let new = Conntrack::default();
        let q2 = Arc::new(CtQuota::default());
        let q2_in = Arc::new(CtQuota::default());
        let slot = |n: &str| match n {
            "p1" => Some((p(11), q2.clone(), q2_in.clone())),
            "p2" => Some((p(12), q2.clone(), q2_in.clone())),
            _ => None,
        };
        // A record without the port its replies come from (an older
        // switch's, unreplied) is not taken up.
        let mut unreplied = recs[0].clone();
        unreplied.reply_port = None;
        unreplied.a.1 += 1;
        recs.push(unreplied);
        assert_eq!(new.import(0, 5, &recs, slot), 1);
        let z2 = zone(0, 7);
        assert_eq!(new.state(z2, &t), Some(CtState::Established));
        // Its replies pass from the reply's port alone.
        assert_eq!(new.track(z2, &t.reversed(), ACK, p(12), 6), Some(p(11)));
        assert_eq!(new.track(z2, &t.reversed(), ACK, p(11), 6), None);
        // Charged to p1, the port it came in on: its own share.
        assert_eq!((q2.held(), q2_in.held()), (1, 0));
    }

    #[test]
    fn a_port_fills_only_its_share_and_the_table_its_limit() {
        let ct = Conntrack::new(10, 4);
        let (a, b) = (Arc::new(CtQuota::default()), Arc::new(CtQuota::default()));
        for n in 0..4 {
            ct.open(0, &tcp(n, 80), SYN, (p(1), p(9)), None, &a, 0)
                .unwrap();
        }
        assert_eq!(
            ct.open(0, &tcp(99, 80), SYN, (p(1), p(9)), None, &a, 0),
            Err(Full::Port)
        );
        // Another port still opens its own.
        for n in 0..4 {
            ct.open(0, &tcp(1000 + n, 80), SYN, (p(2), p(9)), None, &b, 0)
                .unwrap();
        }
        let c = Arc::new(CtQuota::default());
        ct.open(0, &tcp(2000, 80), SYN, (p(3), p(9)), None, &c, 0)
            .unwrap();
        ct.open(0, &tcp(2001, 80), SYN, (p(3), p(9)), None, &c, 0)
            .unwrap();
        assert_eq!(
            ct.open(0, &tcp(2002, 80), SYN, (p(3), p(9)), None, &c, 0),
            Err(Full::Table)
        );
        // Swept in parts: every shard once in turn.
        let mut swept = 0;
        for _ in 0..8 {
            swept += ct.sweep_part(u32::MAX, SHARDS / 8);
        }
        assert_eq!(swept, 10);
        assert_eq!((ct.len(), a.held(), b.held(), c.held()), (0, 0, 0, 0));
    }
}
