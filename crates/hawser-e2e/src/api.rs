//! The controller's REST API read from a test: a GET answered as JSON, with the admin token,
//! over one client kept for the whole test. A test that polls many states in a loop
//! (`backup_seeds`) pays for a `hawser` CLI run per look with a process start and a TLS
//! handshake, on cores its cluster needs; changes still go through the CLI, as an operator's.

use serde::de::DeserializeOwned;

use crate::cluster::Cluster;

/// Reads a cluster's API. It stays valid across controller restarts (same addresses, same
/// tokens).
pub struct Api {
    http: reqwest::blocking::Client,
    urls: Vec<String>,
    bearer: String,
}

impl Api {
    pub fn of(c: &Cluster) -> Api {
        Api {
            http: c.controller_http(),
            urls: c.controllers.iter().map(|x| x.url.clone()).collect(),
            bearer: c.tokens.admin_bearer(),
        }
    }

    /// `GET path` (e.g. `/v1/volumes/db`) from the first controller that answers it with a
    /// success (the leader); otherwise the last answer's status and body, or why no
    /// controller answered.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, String> {
        let mut last = format!("GET {path}: no controller");
        for url in &self.urls {
            let answer = self
                .http
                .get(format!("{url}{path}"))
                .header("authorization", &self.bearer)
                .send();
            match answer {
                Ok(r) if r.status().is_success() => {
                    return r.json().map_err(|e| format!("GET {path}: decode: {e}"));
                }
                Ok(r) => {
                    let status = r.status();
                    last = format!("GET {path}: {status}: {}", r.text().unwrap_or_default());
                }
                Err(e) => last = format!("GET {path}: {e}"),
            }
        }
        Err(last)
    }
}
