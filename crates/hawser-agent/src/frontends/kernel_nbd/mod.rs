//! Kernel NBD over netlink: `/dev/nbdN` served by the volume's export in this process.
//! [`genl`] builds and parses the netlink messages, [`netlink`] talks to the kernel, [`link`]
//! serves one device's connections and replaces the ones the kernel drops.

pub mod genl;
pub mod link;
pub mod netlink;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::frontends::block::BlockDevice;
use crate::nbd::handshake::TRANSMISSION_FLAGS;
use link::DeviceLink;
use netlink::{ConnectConfig, NbdNetlink, NetlinkError};

/// How this node's kernel NBD devices are set up.
#[derive(Clone, Copy, Debug)]
pub struct KernelNbdSettings {
    /// Connections per device (the export allows several: `CAN_MULTI_CONN`).
    pub connections: usize,
    /// A request unanswered this long is resent on a new connection ([`link`]).
    pub io_timeout: Duration,
    /// How long I/O waits for the agent to come back before it fails.
    pub dead_conn_timeout: Duration,
}

/// The backend identifier a device of `volume` served by `node` carries
/// (`/sys/block/nbdN/backend`).
pub fn backend_id(node: &str, volume: &str) -> String {
    format!("hawser:{node}/{volume}")
}

#[derive(Debug, thiserror::Error)]
pub enum KernelNbdError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("socketpair: {0}")]
    Socket(#[from] std::io::Error),
}

/// Make a new device named `backend` on `export` (the kernel picks its index).
pub async fn connect(
    backend: String,
    export: Arc<dyn BlockDevice>,
    settings: KernelNbdSettings,
    shutdown: watch::Receiver<bool>,
) -> Result<DeviceLink, KernelNbdError> {
    let (kernel, ours) = pairs(settings.connections)?;
    let cfg = ConnectConfig {
        index: None,
        size_bytes: export.size(),
        block_size: 4096,
        io_timeout: settings.io_timeout,
        dead_conn_timeout: settings.dead_conn_timeout,
        server_flags: u64::from(TRANSMISSION_FLAGS),
        backend: backend.clone(),
    };
    let index = netlink_call("connect", move || {
        let fds: Vec<i32> = kernel.iter().map(|k| k.as_raw_fd()).collect();
        NbdNetlink::open()?.connect(&cfg, &fds)
    })
    .await?;
    Ok(DeviceLink::serve(index, backend, export, ours, shutdown)?)
}

/// Give device `index` (named `backend`), left by an earlier life of this agent, new
/// connections on `export`.
pub async fn reconnect(
    index: u32,
    backend: String,
    export: Arc<dyn BlockDevice>,
    settings: KernelNbdSettings,
    shutdown: watch::Receiver<bool>,
) -> Result<DeviceLink, KernelNbdError> {
    let (kernel, ours) = pairs(settings.connections)?;
    let name = backend.clone();
    netlink_call("reconfigure", move || {
        let fds: Vec<i32> = kernel.iter().map(|k| k.as_raw_fd()).collect();
        NbdNetlink::open()?.reconfigure(index, &name, &fds)
    })
    .await?;
    Ok(DeviceLink::serve(index, backend, export, ours, shutdown)?)
}

/// Tell device `index` (named `backend`) its new size.
pub async fn resize(index: u32, backend: String, size_bytes: u64) -> Result<(), KernelNbdError> {
    netlink_call("resize", move || {
        NbdNetlink::open()?.resize(index, &backend, size_bytes)
    })
    .await
}

/// End device `index` (its I/O fails with EIO), without serving it first.
pub async fn disconnect(index: u32) -> Result<(), KernelNbdError> {
    netlink_call("disconnect", move || NbdNetlink::open()?.disconnect(index)).await
}

/// Runs a netlink exchange (`what`) on the blocking pool.
async fn netlink_call<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, NetlinkError> + Send + 'static,
) -> Result<T, KernelNbdError> {
    let done = tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| std::io::Error::other(format!("{what} task: {e}")))?;
    Ok(done?)
}

type Pairs = (
    Vec<std::os::fd::OwnedFd>,
    Vec<std::os::unix::net::UnixStream>,
);

fn pairs(n: usize) -> std::io::Result<Pairs> {
    let mut kernel = Vec::with_capacity(n);
    let mut ours = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        let (k, o) = link::pair()?;
        kernel.push(k);
        ours.push(o);
    }
    Ok((kernel, ours))
}
