//! What the agent shows of itself: Prometheus metrics (`GET /metrics` on the admin listener).
//! Request counters are kept where requests pass ([`io`], held by each export); everything
//! else is read at scrape time from the engines and pools ([`state`]), so observing changes
//! nothing. [`metrics`] is the registry that serves both.

pub mod devices;
pub mod io;
pub mod metrics;
pub mod refusals;
mod state;
