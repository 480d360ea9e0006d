//! Loopback ports for the test processes (etcd, the API server, the e2e clusters' agents
//! and controllers), picked so that two test processes running side by side never listen
//! on the same port.
//!
//! A port that was free when it was picked can still be taken before its listener binds
//! it, or later: an e2e test kills an agent and starts it again on its old ports, and in the
//! gap its ports are free as far as the kernel knows. The end-to-end tests run two at a
//! time (.config/nextest.toml), and another test's pick once took such a port ("Address already in
//! use" on the restart). So a pick is also claimed: an exclusive `flock` on a file named
//! after the port, held until the process exits (the kernel drops it even on SIGKILL).
//! Another process skips a port whose claim it cannot take.

use std::fs::{File, OpenOptions};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// Ports tests listen on: below the kernel's ephemeral range (`ip_local_port_range`,
/// 32768-60999 by default). A port picked by binding port 0 comes from that range, and
/// between its release and the test process's bind any outgoing connection (etcd's
/// clients and peers make many) may take it as its local port: "Address already in use".
/// scripts/k8s/up.sh's fixed ports lie below it, so a test beside that cluster never takes
/// one of them first.
pub const TEST_PORTS: std::ops::Range<u32> = 20_000..32_000;

/// Calls so far in this process: each call starts where the previous one stopped, so
/// consecutive picks differ even before the first port is bound.
static PORT_PICKS: AtomicU32 = AtomicU32::new(0);

/// The claims this process holds: open, locked files, kept until the process exits.
static CLAIMS: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// Where the claim files live: one directory per user, shared by every test process.
fn claims_dir() -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to this process's user.
    let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
    std::env::temp_dir().join(format!("hawser-test-ports-{uid}"))
}

/// Claims `port` for this process's life; false if another live process holds it.
fn claim(port: u16) -> Result<bool, String> {
    let dir = claims_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let path = dir.join(port.to_string());
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {
            CLAIMS.lock().unwrap_or_else(|p| p.into_inner()).push(file);
            Ok(true)
        }
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("lock {}: {e}", path.display())),
    }
}

/// A loopback port in [`TEST_PORTS`] that is free and that no other test process has
/// claimed; this process keeps the claim until it exits. Processes start at different
/// points (by PID), so concurrent test runs rarely even try the same ports.
pub fn free_loopback_port() -> Result<u16, String> {
    let len = TEST_PORTS.end - TEST_PORTS.start;
    // A prime stride walks the whole range before repeating.
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..len {
        let pick = PORT_PICKS.fetch_add(1, Ordering::Relaxed);
        let offset = start.wrapping_add(pick.wrapping_mul(104_729)) % len;
        let Ok(port) = u16::try_from(TEST_PORTS.start + offset) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && claim(port)? {
            return Ok(port);
        }
    }
    Err(format!("no free loopback port in {TEST_PORTS:?}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_claimed_port_is_not_claimed_again_while_its_holder_lives() {
        let port = free_loopback_port().unwrap();
        assert!(TEST_PORTS.contains(&u32::from(port)));
        // Another open file description of the same file: flock conflicts with it as it
        // would with another process's.
        let path = claims_dir().join(port.to_string());
        let other = File::open(&path).unwrap();
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        assert!(!claim(port).unwrap(), "a held claim is refused");
        assert_ne!(free_loopback_port().unwrap(), port);
    }
}
