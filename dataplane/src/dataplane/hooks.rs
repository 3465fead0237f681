//! Capture, trace and fault reports: what the workers report to the
//! control thread.

use super::*;

impl Dataplane {
    /// Starts capture `cap` on its port. `Err(false)`: no such port;
    /// `Err(true)`: a capture runs on it already.
    pub fn start_capture(&self, cap: Arc<Capture>) -> Result<(), bool> {
        let mut t = self.table();
        let p = t
            .ports
            .get_mut(cap.port as usize)
            .and_then(Option::as_mut)
            .ok_or(false)?;
        if p.capture.is_some() {
            return Err(true);
        }
        p.capture = Some(cap);
        drop(t);
        self.publish();
        Ok(())
    }

    /// Ends capture `cap` (if still running) and waits until no worker
    /// writes to it any more.
    pub fn stop_capture(&self, cap: &Arc<Capture>) {
        let mut t = self.table();
        let Some(p) = t.ports.get_mut(cap.port as usize).and_then(Option::as_mut) else {
            return;
        };
        if !p.capture.as_ref().is_some_and(|c| Arc::ptr_eq(c, cap)) {
            return;
        }
        p.capture = None;
        self.publish_and_quiesce(t);
    }

    /// Starts trace `trace`; false if one runs already.
    pub fn start_trace(&self, trace: Arc<Trace>) -> bool {
        let mut t = self.table();
        if t.trace.is_some() {
            return false;
        }
        t.trace = Some(trace);
        drop(t);
        self.publish();
        true
    }

    /// Ends trace `trace` (if still running) and waits until no worker
    /// writes to it any more.
    pub fn stop_trace(&self, trace: &Arc<Trace>) {
        let mut t = self.table();
        if !t.trace.as_ref().is_some_and(|x| Arc::ptr_eq(x, trace)) {
            return;
        }
        t.trace = None;
        self.publish_and_quiesce(t);
    }

    /// Reports a protocol fault seen by a worker on port `id`. The worker stops
    /// polling the port; the control thread disconnects it.
    pub fn report_fault(&self, shared: &PortShared, reason: String) {
        if !shared.fault_flag.swap(true, Ordering::AcqRel) {
            *shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
            self.inner.fault_waker.wake();
        }
    }

    /// Ports with a pending fault report, with the reason (control thread).
    pub fn take_faults(&self) -> Vec<(PortId, String)> {
        self.inner.fault_waker.drain();
        let t = self.table();
        let mut out = Vec::new();
        for (i, p) in t.ports.iter().enumerate() {
            if let Some(p) = p {
                if p.shared.fault_flag.load(Ordering::Acquire) {
                    if let Some(r) = p
                        .shared
                        .fault
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take()
                    {
                        out.push((i as PortId, r));
                    }
                }
            }
        }
        out
    }

    /// True when worker code must skip port `shared` (fault pending).
    #[inline]
    pub fn faulted(shared: &PortShared) -> bool {
        shared.fault_flag.load(Ordering::Relaxed)
    }
}
