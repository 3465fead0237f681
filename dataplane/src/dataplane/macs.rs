//! Pinned MACs and aging in the bridges' tables.

use super::*;

impl DpTable {
    /// Port `id`, the VLAN its untagged frames belong to, and its
    /// bridge's MAC table, if it has all three.
    fn port_table(&self, id: PortId) -> Option<(&DpPort, u16, Arc<MacTable>)> {
        let p = self.ports.get(id as usize)?.as_ref()?;
        let domain = p.vlan.ingress(0)?;
        let table = self.bridges.get(p.bridge? as usize)?.as_ref()?.macs.clone();
        Some((p, domain, table))
    }
}

impl Dataplane {
    /// Pins `macs` to port `id` in its bridge, in the VLAN its untagged
    /// frames belong to (a trunk without untagged frames pins its MACs per
    /// VLAN as it sends from them). `Err` names a MAC pinned to another
    /// port (and that port's slot), or one whose table bucket is full of
    /// pinned entries.
    pub fn pin_macs(&self, id: PortId, macs: &[MacAddr]) -> Result<(), (MacAddr, Option<PortId>)> {
        let t = self.table();
        let Some((p, domain, table)) = t.port_table(id) else {
            return Ok(());
        };
        let entry = MacEntry {
            port: id,
            port_gen: p.generation,
            last_seen: self.now_secs(),
            pinned: true,
        };
        for &mac in macs {
            match table.pin(mac, domain, entry) {
                Learned::New => p.shared.security.take(1),
                Learned::Moved(old) | Learned::Evicted(old) => {
                    p.shared.security.take(1);
                    if let Some(o) = t.owner(&old) {
                        o.security.release(1);
                    }
                }
                Learned::Refreshed | Learned::Unchanged => {}
                Learned::Pinned(old) => return Err((mac, Some(old.port))),
                Learned::Held(_) | Learned::Full => return Err((mac, None)),
            }
        }
        Ok(())
    }

    /// Pins `mac` to tunnel port `id` (a remote VTEP's station), in the
    /// VLAN its frames belong to, unless the bridge has it on a port that
    /// is not a tunnel (a local pod's, learned or pinned: a remote
    /// station never takes it). `Err` names the port that holds it, if
    /// one does (or `None`: its bucket is full of pinned entries).
    pub fn pin_remote(&self, id: PortId, mac: MacAddr) -> Result<(), Option<PortId>> {
        {
            let t = self.table();
            let Some((_, domain, table)) = t.port_table(id) else {
                return Ok(());
            };
            if let Some(e) = table.lookup(mac, domain) {
                let local = t
                    .ports
                    .get(e.port as usize)
                    .and_then(Option::as_ref)
                    .filter(|o| o.generation == e.port_gen)
                    .is_some_and(|o| !o.split_horizon);
                if local {
                    return Err(Some(e.port));
                }
            }
        }
        self.pin_macs(id, &[mac]).map_err(|(_, other)| other)
    }

    /// Takes out the entries of `macs` pinned to port `id` (in the VLAN its
    /// frames belong to), giving the port's places back.
    pub fn unpin_macs(&self, id: PortId, macs: &[MacAddr]) {
        let t = self.table();
        let Some((p, domain, table)) = t.port_table(id) else {
            return;
        };
        let mut gone = 0;
        for &mac in macs {
            let here = |e: &MacEntry| e.pinned && e.port == id && e.port_gen == p.generation;
            if table.remove_if(mac, domain, here).is_some() {
                gone += 1;
            }
        }
        p.shared.security.release(gone);
    }

    /// Removes unpinned MAC entries older than `max_age` seconds from every
    /// bridge, giving their ports' places back.
    pub fn age_macs(&self, now: u32, max_age: u32) {
        let tables: Vec<(Arc<MacTable>, Arc<BridgeStats>)> = self
            .table()
            .bridges
            .iter()
            .flatten()
            .map(|b| (b.macs.clone(), b.stats.clone()))
            .collect();
        for (m, stats) in tables {
            let mut gone: Vec<MacEntry> = Vec::new();
            m.age(now, max_age, |r| gone.push(r.entry));
            if !gone.is_empty() {
                // The control thread's own block.
                crate::types::bump(&stats.counters(self.inner.workers).aged, gone.len() as u64);
                let t = self.table();
                for e in &gone {
                    if let Some(o) = t.owner(e) {
                        o.security.release(1);
                    }
                }
            }
        }
    }
}

/// A MAC entry as a takeover carries it from one process to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacSeen {
    /// Address.
    pub mac: MacAddr,
    /// VLAN (0 = untagged).
    pub vlan: u16,
    /// The port's slot.
    pub port: PortId,
    /// Seconds since a frame came from it.
    pub age: u32,
    /// Pinned to its port.
    pub pinned: bool,
}

impl Dataplane {
    /// Bridge `id`'s entries whose port still holds its slot, each with
    /// its age.
    pub fn macs_seen(&self, id: BridgeId) -> Vec<MacSeen> {
        let Some(table) = self.mac_table(id) else {
            return Vec::new();
        };
        let now = self.now_secs();
        let t = self.table();
        table
            .entries()
            .into_iter()
            .filter(|r| t.owner(&r.entry).is_some())
            .map(|r| MacSeen {
                mac: r.mac,
                vlan: r.vlan,
                port: r.entry.port,
                age: now.wrapping_sub(r.entry.last_seen),
                pinned: r.entry.pinned,
            })
            .collect()
    }

    /// Enters `macs`, another process's entries (a takeover), in bridge
    /// `id`'s table, each as old as it was there; their ports count them
    /// against their MAC limits. An entry whose port is gone or not in the
    /// bridge, or that the table refuses, is left out (learned again from
    /// the next frame).
    pub fn learn_seen(&self, id: BridgeId, macs: &[MacSeen]) {
        let Some(table) = self.mac_table(id) else {
            return;
        };
        let now = self.now_secs();
        let t = self.table();
        for m in macs {
            let Some(p) = t
                .ports
                .get(m.port as usize)
                .and_then(Option::as_ref)
                .filter(|p| p.bridge == Some(id))
            else {
                continue;
            };
            let entry = MacEntry {
                port: m.port,
                port_gen: p.generation,
                last_seen: now.wrapping_sub(m.age),
                pinned: m.pinned,
            };
            let learned = if m.pinned {
                table.pin(m.mac, m.vlan, entry)
            } else {
                table.learn(m.mac, m.vlan, entry, 0)
            };
            match learned {
                Learned::New => p.shared.security.take(1),
                Learned::Moved(old) | Learned::Evicted(old) => {
                    p.shared.security.take(1);
                    if let Some(o) = t.owner(&old) {
                        o.security.release(1);
                    }
                }
                _ => {}
            }
        }
    }
}
