//! The CLI's client for the controller API: the shared one from `hawser-api`.

pub use hawser_api::client::{Client, ClientError as CliError};
