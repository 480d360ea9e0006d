//! Listeners with limits. Every TCP port of Hawser (the controller's REST API, an agent's
//! admin API, replica port and NBD port) admits connections through [`ConnLimits`], and the
//! two HTTP APIs are served by [`http::serve`], so that a slow, broken or hostile client gets
//! a bounded share of a listener: it cannot hold every connection slot, keep a connection
//! half-open forever, or make the process buffer unbounded request bodies.

pub mod conns;
pub mod http;

pub use conns::{ConnLimits, ConnPermit, Refused};
pub use http::{serve, HttpLimits, Transport};
