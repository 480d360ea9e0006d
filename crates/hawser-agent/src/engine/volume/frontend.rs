//! The volume engine as the frontends (NBD) see it: a block device whose requests go through
//! the journal keeper and the engine, and make resync yield while they come. An encrypted
//! volume's requests are encrypted here on their way in and decrypted on their way out
//! (`engine/crypt.rs`), so nothing past this point sees plaintext.

use async_trait::async_trait;
use bytes::Bytes;
use hawser_core::{ClientOp, IoError};

use hawser_storage::AlignedBuf;

use super::VolumeEngine;
use crate::engine::crypt::VolumeCipher;
use crate::frontends::block::BlockDevice;

/// An encrypted volume's zeroing is written this much at a time.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

impl VolumeEngine {
    /// A request from the volume's client (the frontend): it also makes resync yield (see
    /// [`crate::engine::rate_limit`]).
    pub(super) async fn client_request(&self, op: ClientOp) -> Result<Option<Bytes>, IoError> {
        if let Some(limit) = &self.resync_rate {
            limit.note_client_io();
        }
        match &self.cipher {
            Some(cipher) => self.encrypted(cipher, op).await,
            None => self.submit(op).await,
        }
    }

    /// `op` on an encrypted volume. Writes go out encrypted and reads come back decrypted.
    /// Zeroing writes encrypted zeros (zeros on disk would read back as noise); a trim is
    /// passed on, and what it discarded reads back as noise, as on dm-crypt.
    async fn encrypted(
        &self,
        cipher: &VolumeCipher,
        op: ClientOp,
    ) -> Result<Option<Bytes>, IoError> {
        match op {
            ClientOp::Read { offset, len } => {
                let data = self.submit(ClientOp::Read { offset, len }).await?;
                Ok(data.map(|d| {
                    let mut buf = d.to_vec();
                    cipher.decrypt(offset, &mut buf);
                    Bytes::from(buf)
                }))
            }
            ClientOp::Write { offset, data, fua } => {
                let mut buf = AlignedBuf::copy_from(&data);
                cipher.encrypt(offset, buf.as_mut_slice());
                let data = buf.into_bytes();
                self.submit(ClientOp::Write { offset, data, fua }).await
            }
            ClientOp::WriteZeroes {
                offset, len, fua, ..
            } => {
                let end = offset + u64::from(len);
                let mut at = offset;
                while at < end {
                    let n = (end - at).min(ZERO_CHUNK_BYTES);
                    let mut buf = AlignedBuf::zeroed(n as usize);
                    cipher.encrypt(at, buf.as_mut_slice());
                    let data = buf.into_bytes();
                    self.submit(ClientOp::Write {
                        offset: at,
                        data,
                        fua,
                    })
                    .await?;
                    at += n;
                }
                Ok(None)
            }
            op @ (ClientOp::Flush | ClientOp::Trim { .. }) => self.submit(op).await,
        }
    }
}

#[async_trait]
impl BlockDevice for VolumeEngine {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
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
