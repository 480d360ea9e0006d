//! The volume engine as the frontends (NBD) see it: a block device whose requests go through
//! the journal keeper and the engine, and make resync yield while they come.

use async_trait::async_trait;
use bytes::Bytes;
use hawser_core::{ClientOp, IoError};

use super::VolumeEngine;
use crate::block::BlockDevice;

impl VolumeEngine {
    /// A request from the volume's client (the frontend): it also makes resync yield (see
    /// [`crate::rate_limit`]).
    pub(super) async fn client_request(&self, op: ClientOp) -> Result<Option<Bytes>, IoError> {
        if let Some(limit) = &self.resync_rate {
            limit.note_client_io();
        }
        self.submit(op).await
    }
}

#[async_trait]
impl BlockDevice for VolumeEngine {
    fn size(&self) -> u64 {
        self.size
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        Ok(self
            .client_request(ClientOp::Read { offset, len })
            .await?
            .unwrap_or_default())
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), IoError> {
        self.client_request(ClientOp::Write { offset, data, fua })
            .await
            .map(|_| ())
    }
    async fn flush(&self) -> Result<(), IoError> {
        self.client_request(ClientOp::Flush).await.map(|_| ())
    }
    async fn trim(&self, offset: u64, len: u32) -> Result<(), IoError> {
        self.client_request(ClientOp::Trim { offset, len })
            .await
            .map(|_| ())
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    ) -> Result<(), IoError> {
        self.client_request(ClientOp::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        })
        .await
        .map(|_| ())
    }
}
