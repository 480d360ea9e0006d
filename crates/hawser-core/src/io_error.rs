//! The error a block request can end with, as seen by a client. Every layer maps its own errors
//! into this one; the NBD frontend maps it to an errno in one place.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum IoError {
    /// Offset/length outside the volume or not sector aligned.
    #[error("request out of range or misaligned")]
    Invalid,
    /// A replica's filesystem is full and no replica could take the write.
    #[error("no space left on a replica")]
    NoSpace,
    /// Every replica that could serve the request failed.
    #[error("I/O error on every replica")]
    Io,
    /// This engine was fenced by a newer epoch, or is shutting down.
    #[error("volume engine fenced or shutting down")]
    ShutDown,
}
