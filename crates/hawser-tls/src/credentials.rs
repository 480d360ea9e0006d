//! A certificate chain and its key as one value: what the CA issues, a slot presents and
//! `pair_files` keeps on disk. Its own file, below both, so neither imports the other.

/// A certificate chain and its key, both PEM, as the CA issued them and as they are kept on
/// disk.
#[derive(Clone)]
pub struct Credentials {
    pub chain_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}
