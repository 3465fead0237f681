//! Handing a port's queues to the workers and back, and spreading
//! receive queues over the workers by load.

use super::*;

impl Dataplane {
    /// Worker `w`'s load counters.
    pub fn worker_load(&self, w: usize) -> &WorkerCounters {
        &self.inner.load[w]
    }

    /// Every connected receive queue: (its worker, port, queue number,
    /// slot), in port order.
    pub fn rx_queues(&self) -> Vec<(usize, PortId, usize, Arc<RxSlot>)> {
        let t = self.table();
        let mut v = Vec::new();
        for (i, p) in t.ports.iter().enumerate() {
            let Some(p) = p else { continue };
            for (q, (slot, &w)) in p.rx.iter().zip(&p.rx_worker).enumerate() {
                v.push((w, i as PortId, q, slot.clone()));
            }
        }
        v
    }

    /// Records worker `w`'s recent busy share (0.0..=1.0), measured by the
    /// control thread; queues attached later go to the least busy worker.
    pub fn set_recent_load(&self, w: usize, share: f64) {
        if let Some(l) = self.inner.recent_load.get(w) {
            l.store((share.clamp(0.0, 1.0) * 1000.0) as u32, Ordering::Relaxed);
        }
    }

    /// Moves receive queues between workers: each `(port, queue, slot,
    /// worker)` whose slot is still that port's queue goes to `worker`.
    /// Workers pick the change up at their next pass; a queue's frames wait
    /// in its ring meanwhile (the slot's claim keeps the two workers from
    /// polling it at once), so none is lost. Returns how many moved.
    pub fn move_queues(&self, moves: &[(PortId, usize, Arc<RxSlot>, usize)]) -> usize {
        let mut t = self.table();
        let mut n = 0;
        for (port, q, slot, to) in moves {
            if *to >= self.inner.workers {
                continue;
            }
            let Some(p) = t.ports.get_mut(*port as usize).and_then(Option::as_mut) else {
                continue;
            };
            if p.rx.get(*q).is_some_and(|s| Arc::ptr_eq(s, slot)) && p.rx_worker[*q] != *to {
                p.rx_worker[*q] = *to;
                n += 1;
            }
        }
        drop(t);
        if n > 0 {
            self.publish();
        }
        n
    }

    /// Where each of a port's queues stands ([`RxQueue::position`],
    /// [`TxQueue::position`]): receive queues, then transmit queues. Only
    /// while the workers are paused ([`Dataplane::pause`]), when no worker
    /// holds a queue; a queue still held (never, then) says `None`.
    pub fn queue_positions(&self, id: PortId) -> QueuePositions {
        let t = self.table();
        let Some(p) = t.ports.get(id as usize).and_then(Option::as_ref) else {
            return QueuePositions::default();
        };
        QueuePositions {
            rx: p
                .rx
                .iter()
                .map(|s| s.claim().and_then(|mut c| c.queue().position()))
                .collect(),
            tx: p.tx.iter().map(|s| s.with(|q| q.position())).collect(),
        }
    }

    /// Gives a connected port's queues to the workers.
    pub fn attach_queues(&self, id: PortId, q: PortQueues) {
        let mut t = self.table();
        // Each new queue goes to the least busy worker (load in 5% steps,
        // then fewest queues), so a port's queues spread out and a loaded
        // worker gets no more.
        let workers = self.inner.workers.max(1);
        let mut count = vec![0usize; workers];
        for p in t.ports.iter().flatten() {
            for &w in &p.rx_worker {
                count[w.min(workers - 1)] += 1;
            }
        }
        let load: Vec<u32> = (0..workers)
            .map(|w| {
                self.inner
                    .recent_load
                    .get(w)
                    .map_or(0, |l| l.load(Ordering::Relaxed) / 50)
            })
            .collect();
        let rx_worker: Vec<usize> = (0..q.rx.len())
            .map(|_| {
                let w = (0..workers)
                    .min_by_key(|&w| (load[w], count[w], w))
                    .unwrap_or(0);
                count[w] += 1;
                w
            })
            .collect();
        if let Some(p) = t.ports.get_mut(id as usize).and_then(Option::as_mut) {
            p.rx_worker = rx_worker;
            p.rx = q.rx.into_iter().map(|q| Arc::new(RxSlot::new(q))).collect();
            p.tx = q.tx.into_iter().map(|q| Arc::new(TxSlot::new(q))).collect();
            p.shared.link_up.store(true, Ordering::Relaxed);
        }
        drop(t);
        self.publish();
    }

    /// Takes a port's queues back (link down) and waits until no worker
    /// polls them any more (at most `DETACH_TIMEOUT`; false if one did not
    /// answer in time). Its MAC entries are flushed and a pending fault
    /// report is cleared: it was about the queues just taken back.
    pub fn detach_queues(&self, id: PortId) -> bool {
        let mut t = self.table();
        let mut macs = None;
        let mut shared = None;
        if let Some(p) = t.ports.get_mut(id as usize).and_then(Option::as_mut) {
            p.rx.clear();
            p.rx_worker.clear();
            p.tx.clear();
            p.shared.link_up.store(false, Ordering::Relaxed);
            shared = Some(p.shared.clone());
            if let Some(b) = p.bridge {
                macs = t
                    .bridges
                    .get(b as usize)
                    .and_then(Option::as_ref)
                    .map(|b| b.macs.clone());
            }
        }
        // Clearing the fault flag any earlier would let a worker still on
        // the old view report the same fault again: counted twice, and left
        // standing against the port's next connection.
        let quiet = self.publish_and_quiesce(t);
        if let Some(s) = &shared {
            *s.fault.lock().unwrap_or_else(|e| e.into_inner()) = None;
            s.fault_flag.store(false, Ordering::Release);
        }
        if let Some(m) = macs {
            // Learned entries go with the link; pinned ones stay, so no
            // other port takes the address while this one is down.
            let removed = m.flush_port(id, true);
            if let Some(s) = shared {
                s.security.release(removed as u32);
            }
        }
        quiet
    }
}
