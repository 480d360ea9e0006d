//! A client of the agent's node-local device API (`crate::agent::AttachDevice`): HTTP/1.1
//! over the agent's unix socket, one request per connection. Blocking and std-only, so the
//! CLI and the CSI node service use it without an async runtime or another HTTP stack.
//!
//! The answer is parsed defensively: the agent is trusted, but a socket path given by mistake
//! (another program's) must give an error that says so, never a panic.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::agent::{AttachDevice, Device};
use crate::ApiError;

/// Attaching can wait for the kernel and for `modprobe`.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Larger answers are not the device API's.
const MAX_ANSWER_BYTES: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DeviceClientError {
    #[error("the agent's device API at {path}: {source} (is the agent running on this node?)")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the agent's device API at {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the agent's device API at {path} answered something that is not HTTP: {what}")]
    NotHttp { path: PathBuf, what: String },
    #[error("the agent refused ({status}): {}", error.message)]
    Refused { status: u16, error: ApiError },
}

pub struct DeviceClient {
    path: PathBuf,
}

impl DeviceClient {
    pub fn new(path: &Path) -> DeviceClient {
        DeviceClient {
            path: path.to_path_buf(),
        }
    }

    pub fn attach(&self, volume: &str, frontend: &str) -> Result<Device, DeviceClientError> {
        self.attach_with(&AttachDevice {
            volume: volume.to_owned(),
            frontend: frontend.to_owned(),
            ublk_queues: None,
            ublk_queue_depth: None,
        })
    }

    /// `attach`, with every field of the request given.
    pub fn attach_with(&self, body: &AttachDevice) -> Result<Device, DeviceClientError> {
        // Serialising a plain struct cannot fail.
        let body = serde_json::to_vec(body).unwrap_or_default();
        let answer = self.call("POST", "/v1/devices", Some(&body))?;
        self.json(&answer)
    }

    pub fn detach(&self, volume: &str) -> Result<(), DeviceClientError> {
        self.call("DELETE", &format!("/v1/devices/{volume}"), None)
            .map(drop)
    }

    pub fn list(&self) -> Result<Vec<Device>, DeviceClientError> {
        let answer = self.call("GET", "/v1/devices", None)?;
        self.json(&answer)
    }

    fn json<T: serde::de::DeserializeOwned>(&self, body: &[u8]) -> Result<T, DeviceClientError> {
        serde_json::from_slice(body).map_err(|e| DeviceClientError::NotHttp {
            path: self.path.clone(),
            what: format!("a body that is not the expected JSON ({e})"),
        })
    }

    /// One request; the body of a 2xx answer, or the agent's error.
    fn call(
        &self,
        method: &str,
        uri: &str,
        body: Option<&[u8]>,
    ) -> Result<Vec<u8>, DeviceClientError> {
        let io = |source| DeviceClientError::Io {
            path: self.path.clone(),
            source,
        };
        let mut s =
            UnixStream::connect(&self.path).map_err(|source| DeviceClientError::Connect {
                path: self.path.clone(),
                source,
            })?;
        s.set_read_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
        s.set_write_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {uri} HTTP/1.1\r\nHost: hawser-agent\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).map_err(io)?;
        s.write_all(body).map_err(io)?;
        let mut answer = Vec::new();
        s.take(MAX_ANSWER_BYTES)
            .read_to_end(&mut answer)
            .map_err(io)?;
        let (status, body) = split_answer(&answer).map_err(|bad| DeviceClientError::NotHttp {
            path: self.path.clone(),
            what: bad.to_string(),
        })?;
        if (200..300).contains(&status) {
            return Ok(body);
        }
        let error = serde_json::from_slice::<ApiError>(&body).unwrap_or_else(|_| {
            ApiError::new(
                crate::ErrorCode::Internal,
                String::from_utf8_lossy(&body).into_owned(),
            )
        });
        Err(DeviceClientError::Refused { status, error })
    }
}

/// What in an answer is not HTTP/1.1 as the device API speaks it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum BadAnswer {
    #[error("no end of headers")]
    NoEndOfHeaders,
    #[error("headers not UTF-8")]
    HeadersNotUtf8,
    #[error("status line {0:?}")]
    StatusLine(String),
    #[error("no chunk size line")]
    NoChunkSizeLine,
    #[error("chunk size {0:?}")]
    ChunkSize(String),
    #[error("chunk truncated")]
    ChunkTruncated,
}

/// The status and body of an HTTP/1.1 answer read to its end (`Connection: close`); a
/// chunked body is decoded.
fn split_answer(a: &[u8]) -> Result<(u16, Vec<u8>), BadAnswer> {
    let end = a
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(BadAnswer::NoEndOfHeaders)?;
    let head = std::str::from_utf8(&a[..end]).map_err(|_| BadAnswer::HeadersNotUtf8)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| BadAnswer::StatusLine(status_line.to_owned()))?;
    let chunked = lines.any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let rest = &a[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok((status, body))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, BadAnswer> {
    let mut out = Vec::new();
    loop {
        let nl = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or(BadAnswer::NoChunkSizeLine)?;
        let line = String::from_utf8_lossy(&b[..nl]);
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| BadAnswer::ChunkSize(line.to_string()))?;
        b = &b[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = b.get(..size).ok_or(BadAnswer::ChunkTruncated)?;
        out.extend_from_slice(chunk);
        b = b.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn answers_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]";
        assert_eq!(split_answer(plain).unwrap(), (200, b"[]".to_vec()));
        let chunked = b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(split_answer(chunked).unwrap(), (409, b"abcde".to_vec()));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for g in [
            &b""[..],
            b"SSH-2.0-OpenSSH\r\n",
            b"HTTP/1.1 \r\n\r\n",
            b"HTTP/1.1 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nff\r\nab",
            b"\xff\xfe\r\n\r\n",
        ] {
            assert!(split_answer(g).is_err(), "{g:?}");
        }
        assert_eq!(split_answer(b"SSH-2.0\r\n"), Err(BadAnswer::NoEndOfHeaders));
        assert_eq!(
            split_answer(b"HTTP/1.1 2\r\n\r\n"),
            Err(BadAnswer::StatusLine("HTTP/1.1 2".into()))
        );
        let truncated = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nff\r\nab";
        assert_eq!(split_answer(truncated), Err(BadAnswer::ChunkTruncated));
        let bad_size = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n";
        assert_eq!(
            split_answer(bad_size),
            Err(BadAnswer::ChunkSize("zz".into()))
        );
    }
}
