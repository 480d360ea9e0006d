//! Which admin token the client commands send: `--token-file`, else `HAWSER_TOKEN`, else
//! the default file `$XDG_CONFIG_HOME/hawser/admin.token` (`~/.config/hawser/admin.token`).
//! The controller writes the token to `<its data-dir>/admin.token` at cluster init; copy it
//! to the default file, or point `--token-file` / `HAWSER_TOKEN_FILE` at it.

use std::path::{Path, PathBuf};

use hawser_api::auth::{read_token_file, validate_token, TOKEN_ENV};

use crate::cli::client::CliError;

/// The default token file, when a config directory can be found.
pub fn default_token_file() -> Option<PathBuf> {
    Some(config_dir()?.join("admin.token"))
}

fn config_dir() -> Option<PathBuf> {
    let config = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(config.join("hawser"))
}

/// The cluster's CA certificate file: `--ca-file`, else `ca.pem` in the config directory
/// when it exists, else none (then only http:// controllers can be reached).
pub fn resolve_ca_path(ca_file: Option<&Path>) -> Option<PathBuf> {
    match ca_file {
        Some(p) => Some(p.to_path_buf()),
        None => config_dir()
            .map(|d| d.join("ca.pem"))
            .filter(|p| p.exists()),
    }
}

/// The token to send, by the precedence above; a clear error if none is found.
pub fn resolve(token_file: Option<&Path>) -> Result<String, CliError> {
    let bad = |e: hawser_api::auth::TokenError| CliError::Token(e.to_string());
    if let Some(path) = token_file {
        return read_token_file(path).map_err(bad);
    }
    if let Ok(token) = std::env::var(TOKEN_ENV) {
        let token = token.trim().to_string();
        validate_token(&token, &format!(" in ${TOKEN_ENV}")).map_err(bad)?;
        return Ok(token);
    }
    match default_token_file() {
        Some(path) if path.exists() => read_token_file(&path).map_err(bad),
        other => Err(CliError::Token(format!(
            "no API token: pass --token-file PATH (or set HAWSER_TOKEN_FILE), set \
             {TOKEN_ENV}, or copy the controller's <data-dir>/admin.token to {}",
            other.map_or("~/.config/hawser/admin.token".into(), |p| p
                .display()
                .to_string())
        ))),
    }
}
