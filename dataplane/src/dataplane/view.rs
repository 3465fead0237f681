//! A worker's private view of the table, rebuilt when its generation
//! moves.

use super::*;

/// A port as one worker sees it.
pub struct ViewPort {
    /// Slot generation (MAC entries carry it).
    pub generation: u16,
    /// Bridge, if the port is in one.
    pub bridge: Option<BridgeId>,
    /// The VLANs it carries.
    pub vlan: VlanMode,
    /// The first of `txs`, if connected: kept apart as one pointer for
    /// the link test made for every frame queued (testing the list's
    /// length there cost 7 instructions a frame in the code generated).
    pub tx: Option<Arc<TxSlot>>,
    /// All the transmit queues this worker uses (none while not
    /// connected): the port's queues `w`, `w + workers`, ... when it has
    /// more queues than there are workers (each worker's own), else the
    /// one queue `w % queues`, shared with other workers. See
    /// [`ViewPort::tx_for`].
    pub txs: Box<[Arc<TxSlot>]>,
    /// Counters and fault reporting.
    pub shared: Arc<PortShared>,
    /// The capture running on the port, if any.
    pub capture: Option<Arc<Capture>>,
    /// One of its bridge's full mesh of tunnels: frames from it go to no
    /// other such port ([`Dataplane::set_split_horizon`]).
    pub split_horizon: bool,
    /// Its bridge and slot generation as one number
    /// ([`ViewPort::membership`]; 0 outside any bridge): what a bridge's
    /// MAC entry is checked against, in one compare, for each frame sent
    /// to the port it names.
    pub member: u64,
    /// Its L3/L4 policy and station addresses, if it has any.
    pub rules: Option<Arc<PortRules>>,
    /// Its policers, where it is limited.
    pub policers: super::Policers,
}

impl ViewPort {
    /// [`ViewPort::member`] of a port of `bridge` whose slot generation is
    /// `generation` (as a MAC entry holds it, 15 bits).
    #[inline]
    pub fn membership(bridge: BridgeId, generation: u16) -> u64 {
        (u64::from(bridge) + 1) << 16 | u64::from(generation)
    }

    /// The transmit queue for frames received on queue `rxq` of their
    /// port, if connected: one of this worker's queues of the port, by the
    /// receive queue's number. A port with as many queues as the port the
    /// frames came from takes them on the same queue number, as testpmd's
    /// io forwarding does, so that a multi-queue peer gets its frames back
    /// spread over its queues as it sent them (and never more on one queue
    /// than it put in flight there); the frames of one receive queue keep
    /// their order.
    #[inline]
    pub fn tx_for(&self, rxq: usize) -> Option<&TxSlot> {
        match self.txs.len() {
            0 | 1 => self.tx.as_deref(),
            n => Some(&self.txs[rxq % n]),
        }
    }
}

/// A bridge as one worker sees it.
pub struct ViewBridge {
    /// Learning table.
    pub macs: Arc<MacTable>,
    /// Event counters.
    pub stats: Arc<BridgeStats>,
    /// Member ports.
    pub ports: Vec<PortId>,
    /// Some member port has L3/L4 rules: the bridge's frames are judged
    /// by policy (a bridge without pays nothing for it).
    pub policed: bool,
    /// The neighbours it answers for, if any (an overlay's remote pods).
    pub neigh: Option<Arc<Neighbours>>,
}

/// Where a burst was received: its port and the port's receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ingress {
    /// The port.
    pub port: PortId,
    /// The receive queue's number in the port; it picks the transmit
    /// queue on each destination ([`ViewPort::tx_for`]).
    pub queue: usize,
}

/// A receive queue assigned to a worker.
pub struct ViewRx {
    /// Owning port.
    pub port: PortId,
    /// The queue's number in its port.
    pub queue: usize,
    /// The queue.
    pub slot: Arc<RxSlot>,
    /// Its port's `rx` policer, if the port is limited in what it sends
    /// ([`crate::forward::police_rx`]): tested once a burst.
    pub policer: Option<Arc<Policer>>,
}

impl ViewRx {
    /// Where this queue's bursts come from, for the forwarder.
    #[inline]
    pub fn ingress(&self) -> Ingress {
        Ingress {
            port: self.port,
            queue: self.queue,
        }
    }
}

/// Everything a worker needs, private to that worker.
#[derive(Default)]
pub struct WorkerView {
    /// Receive queues to poll.
    pub rx: Vec<ViewRx>,
    /// Ports by slot.
    pub ports: Vec<Option<ViewPort>>,
    /// Bridges by slot.
    pub bridges: Vec<Option<ViewBridge>>,
    /// The running trace, if any.
    pub trace: Option<Arc<Trace>>,
}

impl Dataplane {
    /// Builds worker `w`'s private view of the current table.
    pub fn build_view(&self, w: usize, view: &mut WorkerView) -> u64 {
        let t = self.table();
        let generation = self.generation();
        view.rx.clear();
        view.ports.clear();
        view.bridges.clear();
        if t.paused {
            // Nothing is forwarded while paused: an empty view, so that a
            // takeover's thousand port additions cost a paused worker
            // nothing each.
            return generation;
        }
        let workers = self.inner.workers.max(1);
        for (i, p) in t.ports.iter().enumerate() {
            let Some(p) = p else {
                view.ports.push(None);
                continue;
            };
            for (queue, (slot, &qw)) in p.rx.iter().zip(&p.rx_worker).enumerate() {
                if qw == w {
                    view.rx.push(ViewRx {
                        port: i as PortId,
                        queue,
                        slot: slot.clone(),
                        policer: p.policers.rx.clone(),
                    });
                }
            }
            let txs: Box<[_]> = if p.tx.len() > workers {
                p.tx.iter().skip(w).step_by(workers).cloned().collect()
            } else if p.tx.is_empty() {
                Box::new([])
            } else {
                Box::new([p.tx[w % p.tx.len()].clone()])
            };
            view.ports.push(Some(ViewPort {
                generation: p.generation,
                bridge: p.bridge,
                vlan: p.vlan.clone(),
                tx: txs.first().cloned(),
                txs,
                shared: p.shared.clone(),
                capture: p.capture.clone(),
                split_horizon: p.split_horizon,
                member: p.bridge.map_or(0, |b| {
                    ViewPort::membership(b, p.generation & GENERATION_MASK)
                }),
                rules: p.rules.clone(),
                policers: p.policers.clone(),
            }));
        }
        for b in t.bridges.iter() {
            view.bridges.push(b.as_ref().map(|b| ViewBridge {
                macs: b.macs.clone(),
                stats: b.stats.clone(),
                ports: b.ports.clone(),
                policed: b.ports.iter().any(|&id| {
                    t.ports
                        .get(id as usize)
                        .and_then(Option::as_ref)
                        .is_some_and(|p| p.rules.is_some())
                }),
                neigh: b.neigh.clone(),
            }));
        }
        view.trace = t.trace.clone();
        generation
    }
}
