//! What an S3 target answered: every request goes through [`Watched`], which counts the
//! answers object_store will retry (5xx, 429, transport errors) and keeps the last of them,
//! so a running backup shows its retries and a failed one can say the target was throttling
//! (`503 SlowDown`) rather than only "non-2xx". It changes no answer: the retry policy stays
//! object_store's.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::ClientOptions;

use crate::constants::MAX_ERROR_BODY_BYTES;
use crate::progress::Progress;

/// An error answer of the target: its HTTP status and S3 error code, if it had them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answer {
    pub status: Option<u16>,
    pub code: Option<String>,
}

impl Answer {
    /// The answer a store gives when asked to slow down: 503 (S3's SlowDown) or 429.
    pub fn is_throttling(&self) -> bool {
        matches!(self.status, Some(503 | 429)) || self.code.as_deref() == Some("SlowDown")
    }

    /// `HTTP 503 SlowDown`, `HTTP 500`, or `no answer`.
    pub fn describe(&self) -> String {
        match (self.status, &self.code) {
            (Some(s), Some(c)) => format!("HTTP {s} {c}"),
            (Some(s), None) => format!("HTTP {s}"),
            (None, _) => "no answer".into(),
        }
    }
}

/// One target's answers, shared by its clones.
#[derive(Debug, Default)]
pub struct Health {
    retried: AtomicU64,
    last: Mutex<Option<Answer>>,
    /// The running job's progress, which shows the retries as they happen.
    progress: OnceLock<Arc<Progress>>,
}

impl Health {
    /// Answers that object_store retries (all of them, once a request has succeeded).
    pub fn retries(&self) -> u64 {
        self.retried.load(Relaxed)
    }

    /// The last answer that was an error.
    pub fn last_error(&self) -> Option<Answer> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Shows the retries in `progress` from now on (the first job's progress only).
    pub fn report_to(&self, progress: &Arc<Progress>) {
        let _ = self.progress.set(progress.clone());
    }

    fn saw(&self, answer: Answer) {
        self.retried.fetch_add(1, Relaxed);
        if let Some(p) = self.progress.get() {
            p.retried();
        }
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(answer);
    }
}

/// Makes object_store's usual reqwest client, wrapped in [`Watched`].
#[derive(Debug)]
pub struct WatchConnector(pub Arc<Health>);

impl HttpConnector for WatchConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Watched {
            inner,
            health: self.0.clone(),
        }))
    }
}

#[derive(Debug)]
struct Watched {
    inner: HttpClient,
    health: Arc<Health>,
}

#[async_trait::async_trait]
impl HttpService for Watched {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let answer = match self.inner.execute(req).await {
            Ok(r) => r,
            Err(e) => {
                self.health.saw(Answer::default());
                return Err(e);
            }
        };
        let status = answer.status().as_u16();
        if status < 500 && status != 429 {
            return Ok(answer);
        }
        // The S3 code is in the XML body; read it only if it is small and says its size.
        let small = answer
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .is_some_and(|n| n <= MAX_ERROR_BODY_BYTES);
        if !small {
            self.health.saw(Answer {
                status: Some(status),
                code: None,
            });
            return Ok(answer);
        }
        let (parts, body) = answer.into_parts();
        let body = body.bytes().await?;
        self.health.saw(Answer {
            status: Some(status),
            code: s3_code(&body),
        });
        Ok(HttpResponse::from_parts(parts, body.into()))
    }
}

/// The `<Code>` of an S3 error body, if it has a short one of letters and digits.
fn s3_code(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    let code = &text[start..start + len];
    (!code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| code.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_read_from_s3_error_bodies_and_garbage_gives_none() {
        let body = b"<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>x</Message>";
        assert_eq!(s3_code(body).as_deref(), Some("SlowDown"));
        for bad in [
            &b""[..],
            b"<Code>",
            b"<Code></Code>",
            b"</Code><Code>",
            b"<Code>a b</Code>",
            b"\xff\xfe<Code>X</Code>",
        ] {
            assert_eq!(s3_code(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn throttling_is_503_429_or_slowdown() {
        let a = |status, code: Option<&str>| Answer {
            status,
            code: code.map(str::to_owned),
        };
        assert!(a(Some(503), None).is_throttling());
        assert!(a(Some(429), None).is_throttling());
        assert!(a(Some(500), Some("SlowDown")).is_throttling());
        assert!(!a(Some(500), Some("InternalError")).is_throttling());
        assert!(!a(None, None).is_throttling());
        assert_eq!(
            a(Some(503), Some("SlowDown")).describe(),
            "HTTP 503 SlowDown"
        );
        assert_eq!(a(None, None).describe(), "no answer");
    }
}
