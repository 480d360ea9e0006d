//! The block-device seam between frontends (NBD today, ublk later) and whatever serves the
//! blocks (a volume engine, or a plain file in tests). Frontends validate alignment and range
//! against `size()` before calling; implementations check again.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use hawser_core::IoError;
use tracing::warn;

#[async_trait]
pub trait BlockDevice: Send + Sync + 'static {
    /// Size in bytes (a multiple of 4096).
    fn size(&self) -> u64;
    /// Read `len` bytes at `offset`.
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError>;
    /// Write `data` at `offset`; with `fua` the data is durable when this returns.
    /// `data` is 4096-aligned in memory when it came from a frontend (see `AlignedBuf`).
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), IoError>;
    /// Make every write that completed before this call durable.
    async fn flush(&self) -> Result<(), IoError>;
    /// Discard a range; it reads back as zeroes.
    async fn trim(&self, offset: u64, len: u32) -> Result<(), IoError>;
    /// Zero a range; `may_trim` allows deallocating it.
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    ) -> Result<(), IoError>;
}

tokio::task_local! {
    /// Set by a frontend around each request it runs: whether the request is alone in its
    /// connection's queue (nothing else of the connection running, no further request read
    /// and waiting). A device may run a lone small request inline, which saves two thread
    /// hops at queue depth 1; requests of a deeper queue run inline would be serialised.
    static ALONE: bool;
}

/// Run `request` (a frontend's call into a device) knowing whether it is `alone`.
pub fn with_queue_hint<F: std::future::Future>(
    alone: bool,
    request: F,
) -> impl std::future::Future<Output = F::Output> {
    ALONE.scope(alone, request)
}

/// Whether the request being polled is alone in its frontend's queue; true when no frontend
/// said (callers inside the agent, tests), which leaves the choice to the device.
pub fn request_is_alone() -> bool {
    ALONE.try_with(|alone| *alone).unwrap_or(true)
}

/// A request that passed a frontend's validation (NBD's `check_request`, ublk's `decode`),
/// ready for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read {
        offset: u64,
        len: u32,
    },
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    },
}

impl Op {
    /// Bytes of data this request holds in memory while in flight.
    pub fn data_bytes(&self) -> u32 {
        match *self {
            Op::Read { len, .. } | Op::Write { len, .. } => len,
            _ => 0,
        }
    }
}

/// Perform one validated request. A successful read returns its data.
pub async fn execute(
    device: &dyn BlockDevice,
    op: Op,
    payload: Bytes,
) -> Result<Option<Bytes>, IoError> {
    match op {
        Op::Read { offset, len } => {
            let data = device.read(offset, len).await?;
            // A short or long read would desynchronise the stream for every later reply.
            if u32::try_from(data.len()) != Ok(len) {
                warn!(
                    offset,
                    len,
                    got = data.len(),
                    "block device returned a wrong-sized read"
                );
                return Err(IoError::Io);
            }
            Ok(Some(data))
        }
        Op::Write { offset, fua, .. } => device.write(offset, payload, fua).await.map(|()| None),
        Op::Flush => device.flush().await.map(|()| None),
        Op::Trim { offset, len, fua } => {
            device.trim(offset, len).await?;
            // TRIM has no FUA of its own on the device seam; a flush gives the same guarantee.
            if fua {
                device.flush().await?;
            }
            Ok(None)
        }
        Op::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => device
            .write_zeroes(offset, len, fua, may_trim)
            .await
            .map(|()| None),
    }
}

/// Who an export serves: its volume's uid (None: a volume without one, or a device outside a
/// cluster) and the epoch of the engine behind it when looked up. A name is not an identity:
/// after a delete, a volume of the same name is another volume, with another uid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportIdentity {
    pub uid: Option<String>,
    pub epoch: u64,
}

/// Finds the device behind an NBD export name (a volume attached on this node).
pub trait ExportRegistry: Send + Sync + 'static {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockDevice>>;
    /// [`ExportRegistry::lookup`], with who the device found serves (read together, so the
    /// identity is the device's own). Registries of devices without one (tests) keep the
    /// default: no uid, epoch 0.
    fn lookup_identified(&self, name: &str) -> Option<(Arc<dyn BlockDevice>, ExportIdentity)> {
        self.lookup(name).map(|d| (d, ExportIdentity::default()))
    }
    /// Names of all exports, for NBD_OPT_LIST.
    fn names(&self) -> Vec<String>;
}
