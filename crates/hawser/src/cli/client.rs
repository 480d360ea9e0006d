//! The CLI's blocking HTTP client for the controller API, and the CLI's error type.

use std::time::Duration;

use hawser_api::error::{error_chain, truncate_chars};
use hawser_api::ApiError;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Longest the CLI waits for one answer. Attach starts an engine on a node (which connects
/// to every replica), so this is well above the controller's own agent timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The controller refused the request; its message is what the user needs.
    #[error("{}", .0.message)]
    Api(ApiError),
    #[error("cannot reach the controller at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("unexpected answer from {url} (HTTP {status}): {body}")]
    BadResponse {
        url: String,
        status: u16,
        body: String,
    },
    #[error("build the HTTP client: {0}")]
    Client(String),
}

pub struct Client {
    base: String,
    http: reqwest::blocking::Client,
}

impl Client {
    pub fn new(base: &str) -> Result<Client, CliError> {
        let http = reqwest::blocking::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| CliError::Client(error_chain(&e)))?;
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            http,
        })
    }

    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        let body = self.send(reqwest::Method::GET, path, None::<&()>)?;
        self.decode(path, &body)
    }

    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        b: &B,
    ) -> Result<T, CliError> {
        let body = self.send(reqwest::Method::POST, path, Some(b))?;
        self.decode(path, &body)
    }

    pub fn delete(&self, path: &str) -> Result<(), CliError> {
        self.send(reqwest::Method::DELETE, path, None::<&()>)
            .map(|_| ())
    }

    /// Sends a request and returns the body of a 2xx answer; anything else is an error,
    /// decoded from the controller's `ApiError` when it sent one.
    fn send<B: Serialize>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<String, CliError> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().map_err(|e| CliError::Unreachable {
            url: self.base.clone(),
            reason: error_chain(&e),
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().map_err(|e| CliError::Unreachable {
            url: self.base.clone(),
            reason: error_chain(&e),
        })?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        match serde_json::from_str::<ApiError>(&text) {
            Ok(e) => Err(CliError::Api(e)),
            Err(_) => Err(CliError::BadResponse {
                url,
                status,
                body: truncate_chars(&text, 300),
            }),
        }
    }

    fn decode<T: DeserializeOwned>(&self, path: &str, body: &str) -> Result<T, CliError> {
        serde_json::from_str(body).map_err(|e| CliError::BadResponse {
            url: format!("{}{path}", self.base),
            status: 200,
            body: format!("{e}: {}", truncate_chars(body, 300)),
        })
    }
}
