//! What workers hand to an operator looking at traffic: packet capture
//! ([`capture`]) and per-frame forwarding decisions ([`trace`]).
//!
//! Both are off until the control API starts one; a worker then sees it in
//! its view (a port's capture, the data plane's trace) and takes the slow
//! path for that burst only. Idle, they cost one test of an `Option` per
//! burst (and one per destination flush for capture). Records go into
//! bounded lock-free queues with buffers allocated when the session starts;
//! a session whose reader falls behind loses its own records (counted),
//! never a data frame.

pub mod capture;
pub mod trace;

pub use capture::{Capture, CaptureFrame, Direction};
pub use trace::{Trace, TraceLearn, TraceLookup, TraceRecord};
