//! The cluster tokens of a test cluster. The fixture writes them before any controller
//! starts and passes the same files to every controller (which adopt them at cluster init),
//! to every agent (`--token-file`) and to the CLI (`HAWSER_TOKEN_FILE`), so clusters with
//! several controllers on etcd share one set of tokens.

use std::path::{Path, PathBuf};

use rand::RngCore;

#[derive(Clone, Debug)]
pub struct TokenFiles {
    pub admin: PathBuf,
    pub agent: PathBuf,
}

impl TokenFiles {
    /// Writes two new random tokens (256 bits, hex) into `dir`, mode 0600.
    pub fn seed(dir: &Path) -> TokenFiles {
        use std::os::unix::fs::PermissionsExt;
        let files = TokenFiles {
            admin: dir.join("admin.token"),
            agent: dir.join("agent.token"),
        };
        for path in [&files.admin, &files.agent] {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            std::fs::write(path, format!("{token}\n")).expect("write token file");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .expect("chmod token file");
        }
        files
    }

    /// The controller arguments naming these files.
    pub fn controller_args(&self) -> Vec<String> {
        vec![
            "--admin-token-file".into(),
            self.admin.display().to_string(),
            "--agent-token-file".into(),
            self.agent.display().to_string(),
        ]
    }

    /// `Authorization` header value for the admin API.
    pub fn admin_bearer(&self) -> String {
        bearer(&self.admin)
    }

    /// `Authorization` header value for agents' admin API.
    pub fn agent_bearer(&self) -> String {
        bearer(&self.agent)
    }
}

fn bearer(path: &Path) -> String {
    let token = std::fs::read_to_string(path).expect("read token file");
    format!("Bearer {}", token.trim())
}
