//! Direct requests to one replica, local or remote, outside the engine: what journal commits
//! and crash recovery need (journals, checksums, and the copies and flushes of recovery).
//! Each answers with a `String` error naming the replica and the operation.

use std::sync::Arc;

use bytes::Bytes;
use hawser_storage::{Replica, StoredJournal};
use hawser_wire::frame::{Op, Status};
use hawser_wire::journal::StoredReport;

use crate::replica::client::ReplicaClient;

#[derive(Clone)]
pub enum Access {
    Local(Arc<Replica>),
    Remote {
        id: String,
        client: Arc<ReplicaClient>,
    },
}

/// Why a direct request failed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("replica {replica}: {op}: a newer engine owns the volume")]
    StaleEpoch { replica: String, op: &'static str },
    #[error("replica {replica}: {op}: connection lost")]
    Lost { replica: String, op: &'static str },
    /// The replica's disk failed the operation (or the replica is marked failed).
    #[error("replica {replica}: {op}: disk error: {detail}")]
    Disk {
        replica: String,
        op: &'static str,
        detail: String,
    },
    #[error("replica {replica}: {op}: {detail}")]
    Failed {
        replica: String,
        op: &'static str,
        detail: String,
    },
}

impl AccessError {
    pub fn is_stale_epoch(&self) -> bool {
        matches!(self, AccessError::StaleEpoch { .. })
    }

    pub fn is_disk_error(&self) -> bool {
        matches!(self, AccessError::Disk { .. })
    }
}

impl Access {
    pub fn id(&self) -> &str {
        match self {
            Access::Local(r) => r.id(),
            Access::Remote { id, .. } => id,
        }
    }

    fn err(&self, op: &'static str, detail: impl ToString) -> AccessError {
        AccessError::Failed {
            replica: self.id().to_owned(),
            op,
            detail: detail.to_string(),
        }
    }

    /// Run a blocking local operation on the blocking pool.
    async fn local<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Replica) -> Result<T, hawser_storage::ReplicaIoError> + Send + 'static,
    ) -> Result<T, AccessError> {
        let Access::Local(r) = self else {
            unreachable!("local access on a remote replica")
        };
        let r = r.clone();
        let id = r.id().to_owned();
        match tokio::task::spawn_blocking(move || f(&r)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(hawser_storage::ReplicaIoError::StaleEpoch { .. })) => {
                Err(AccessError::StaleEpoch { replica: id, op })
            }
            Ok(Err(
                e @ (hawser_storage::ReplicaIoError::Io { .. }
                | hawser_storage::ReplicaIoError::Failed),
            )) => Err(AccessError::Disk {
                replica: id,
                op,
                detail: e.to_string(),
            }),
            Ok(Err(e)) => Err(self.err(op, e)),
            Err(e) => Err(self.err(op, e)),
        }
    }

    /// One remote request; `Ok(payload)` when the replica answered Ok.
    async fn remote(
        &self,
        op_name: &'static str,
        op: Op,
        offset: u64,
        length: u32,
        payload: Option<Bytes>,
    ) -> Result<Option<Bytes>, AccessError> {
        let Access::Remote { id, client } = self else {
            unreachable!("remote access on a local replica")
        };
        match client.call(op, offset, length, payload).await {
            None => Err(AccessError::Lost {
                replica: id.clone(),
                op: op_name,
            }),
            Some((Status::Ok, p)) => Ok(p),
            Some((Status::StaleEpoch, _)) => Err(AccessError::StaleEpoch {
                replica: id.clone(),
                op: op_name,
            }),
            Some((status @ (Status::IoError | Status::Unavailable), _)) => Err(AccessError::Disk {
                replica: id.clone(),
                op: op_name,
                detail: format!("replica answered {status:?}"),
            }),
            Some((status, _)) => Err(self.err(op_name, format!("replica answered {status:?}"))),
        }
    }

    /// The replica's newest journal, and whether its node rebooted since storing it; `None`
    /// when it has none or it is unreadable.
    pub async fn get_journal(&self, epoch: u64) -> Result<Option<StoredReport>, AccessError> {
        const OP: &str = "read journal";
        match self {
            Access::Local(_) => {
                let stored = self.local(OP, move |r| r.get_journal(epoch)).await?;
                Ok(match stored {
                    StoredJournal::Found { journal, rebooted } => {
                        Some(StoredReport { journal, rebooted })
                    }
                    StoredJournal::Missing | StoredJournal::Unreadable => None,
                })
            }
            Access::Remote { .. } => match self.remote(OP, Op::GetJournal, 0, 0, None).await? {
                None => Ok(None),
                Some(p) if p.is_empty() => Ok(None),
                Some(p) => StoredReport::decode(&p)
                    .map(Some)
                    .map_err(|e| self.err(OP, e)),
            },
        }
    }

    pub async fn put_journal(&self, epoch: u64, encoded: Bytes) -> Result<(), AccessError> {
        const OP: &str = "write journal";
        match self {
            Access::Local(_) => {
                self.local(OP, move |r| r.put_journal(epoch, &encoded))
                    .await
            }
            Access::Remote { .. } => {
                let len = u32::try_from(encoded.len()).map_err(|e| self.err(OP, e))?;
                self.remote(OP, Op::PutJournal, 0, len, Some(encoded))
                    .await
                    .map(|_| ())
            }
        }
    }

    pub async fn checksum(&self, epoch: u64, offset: u64, len: u32) -> Result<Bytes, AccessError> {
        const OP: &str = "checksum";
        match self {
            Access::Local(_) => {
                self.local(OP, move |r| r.checksum(epoch, offset, len))
                    .await
            }
            Access::Remote { .. } => self
                .remote(OP, Op::Checksum, offset, len, None)
                .await?
                .ok_or_else(|| self.err(OP, "empty checksum reply")),
        }
    }

    pub async fn read(&self, epoch: u64, offset: u64, len: u32) -> Result<Bytes, AccessError> {
        const OP: &str = "read";
        match self {
            Access::Local(_) => self.local(OP, move |r| r.read(epoch, offset, len)).await,
            Access::Remote { .. } => self
                .remote(OP, Op::Read, offset, len, None)
                .await?
                .filter(|p| p.len() == len as usize)
                .ok_or_else(|| self.err(OP, "short read reply")),
        }
    }

    pub async fn write(&self, epoch: u64, offset: u64, data: Bytes) -> Result<(), AccessError> {
        const OP: &str = "write";
        match self {
            Access::Local(_) => {
                self.local(OP, move |r| r.write(epoch, offset, &data, false))
                    .await
            }
            Access::Remote { .. } => {
                let len = u32::try_from(data.len()).map_err(|e| self.err(OP, e))?;
                self.remote(OP, Op::Write, offset, len, Some(data))
                    .await
                    .map(|_| ())
            }
        }
    }

    pub async fn flush(&self, epoch: u64) -> Result<(), AccessError> {
        const OP: &str = "flush";
        match self {
            Access::Local(_) => self.local(OP, move |r| r.flush(epoch)).await,
            Access::Remote { .. } => self.remote(OP, Op::Flush, 0, 0, None).await.map(|_| ()),
        }
    }
}
