//! How a volume reaches its users: the block-device seam ([`block`]) between a frontend and
//! the engine that serves it. The NBD server ([`crate::nbd`]) is the frontend today; the
//! kernel frontends (ublk, kernel NBD over netlink) of issue 42 land here.

pub mod block;
pub mod device_identity;
pub mod devices;
pub mod kernel;
pub mod kernel_nbd;
pub mod ublk;
