//! Reading and writing replica protocol frames on an async stream. A frame is accepted only
//! after its header decodes and its payload checksum matches; anything else is an error that
//! closes the connection, so a corrupt frame never reaches a disk.

use bytes::Bytes;
use hawser_storage::AlignedBuf;
use hawser_wire::frame::{FrameError, FrameHeader, HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
pub enum FrameIoError {
    #[error("connection closed")]
    Closed,
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("bad frame: {0}")]
    Frame(#[from] FrameError),
    #[error("no {0} within the time allowed")]
    Timeout(&'static str),
}

/// Read one frame. Returns `Closed` on a clean EOF before a header.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<(FrameHeader, Option<Bytes>), FrameIoError> {
    let header = read_header(r).await?;
    let payload = read_payload(r, &header).await?;
    Ok((header, payload))
}

/// Read and decode one frame header (its payload follows: [`read_payload`]). Returns `Closed`
/// on a clean EOF before a header. A server reads the header alone first, to decide what the
/// payload may cost before it allocates it.
pub async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> Result<FrameHeader, FrameIoError> {
    let mut hdr = [0u8; HEADER_LEN];
    match r.read_exact(&mut hdr).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(FrameIoError::Closed)
        }
        Err(e) => return Err(e.into()),
    }
    Ok(FrameHeader::decode(&hdr)?)
}

/// Read the payload `header` announces and check its checksum.
pub async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    header: &FrameHeader,
) -> Result<Option<Bytes>, FrameIoError> {
    if header.payload_len == 0 {
        header.check_payload(&[])?;
        return Ok(None);
    }
    // payload_len <= MAX_PAYLOAD_BYTES was checked by decode.
    let mut buf = AlignedBuf::for_overwrite(header.payload_len as usize);
    r.read_exact(buf.as_mut_slice()).await?;
    header.check_payload(buf.as_slice())?;
    Ok(Some(buf.into_bytes()))
}

/// Write one frame (header then payload). The caller flushes.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &FrameHeader,
    payload: Option<&[u8]>,
) -> std::io::Result<()> {
    w.write_all(&header.encode()).await?;
    if let Some(p) = payload {
        w.write_all(p).await?;
    }
    Ok(())
}
