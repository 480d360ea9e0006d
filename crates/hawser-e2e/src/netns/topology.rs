//! The network of a `NetCluster`: one "switch" namespace holding a Linux bridge, and one
//! namespace per host (and one for the controller) joined to it by a veth pair, on a private
//! /24. Nothing is created in the root namespace, so no test traffic leaves these namespaces.
//!
//! Names are `hawser-<pid-ns inode>-<pid>-<k>-<role>`: unique per process and cluster, and
//! enough to find the leftovers of a run that crashed (its pid is gone) without touching
//! those of a run still going, also one in another pid namespace (other inode).

use std::process::Command;

use crate::run::{have, run_ok, sh};

/// The bridge inside the switch namespace.
const BRIDGE: &str = "br0";
/// The host side of each veth pair, inside the host's namespace.
const HOST_IF: &str = "eth0";
/// First octets of the private subnets: 10.77.X.0/24.
const SUBNET_PREFIX: &str = "10.77";

/// This process's pid namespace, as the inode number of `/proc/self/ns/pid`.
fn pid_ns() -> String {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|p| {
            let s = p.to_string_lossy().into_owned();
            let digits: String = s.chars().filter(char::is_ascii_digit).collect();
            (!digits.is_empty()).then_some(digits)
        })
        .unwrap_or_else(|| "0".into())
}

/// Prefix of every name this process gives a namespace or test directory, up to `<pid>-`
/// exclusive: `hawser-<pid-ns>-`.
pub(crate) fn run_prefix() -> String {
    format!("hawser-{}-", pid_ns())
}

pub struct Topology {
    /// `hawser-<pid-ns>-<pid>-<k>`.
    prefix: String,
    subnet: u8,
    switch: String,
    /// Host and controller namespaces, in creation order.
    members: Vec<String>,
}

impl Topology {
    /// Create the switch namespace with its bridge; `k` numbers the clusters of this process.
    pub fn create(k: u32) -> Topology {
        let pid = std::process::id();
        let prefix = format!("{}{pid}-{k}", run_prefix());
        // Clusters cannot reach each other (separate bridges); distinct subnets only make
        // logs of concurrent clusters easier to tell apart.
        let subnet = u8::try_from(1 + (u64::from(pid) * 31 + u64::from(k)) % 250).unwrap_or(1);
        let switch = format!("{prefix}-sw");
        let t = Topology {
            prefix,
            subnet,
            switch,
            members: Vec::new(),
        };
        run_ok("ip", &["netns", "add", &t.switch]);
        run_ok("ip", &["-n", &t.switch, "link", "set", "lo", "up"]);
        let add = ["-n", &t.switch, "link", "add", BRIDGE, "type", "bridge"];
        run_ok("ip", &add);
        run_ok("ip", &["-n", &t.switch, "link", "set", BRIDGE, "up"]);
        t
    }

    /// Address `10.77.X.<octet>` of this cluster's subnet.
    pub fn addr(&self, octet: u8) -> String {
        format!("{SUBNET_PREFIX}.{}.{octet}", self.subnet)
    }

    /// Create namespace `<prefix>-<role>` with `lo` up and `eth0` at `addr(octet)`, plugged
    /// into the bridge. Returns the namespace's name.
    pub fn add(&mut self, role: &str, octet: u8) -> String {
        let ns = format!("{}-{role}", self.prefix);
        run_ok("ip", &["netns", "add", &ns]);
        self.members.push(ns.clone());
        run_ok("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        // Created inside the switch namespace with its peer placed straight into the host's:
        // no interface ever exists in the root namespace, so names cannot collide there.
        let sw = self.switch.as_str();
        let veth = [
            "-n", sw, "link", "add", role, "type", "veth", "peer", "name",
        ];
        run_ok("ip", &[&veth[..], &[HOST_IF, "netns", &ns]].concat());
        run_ok(
            "ip",
            &["-n", sw, "link", "set", role, "master", BRIDGE, "up"],
        );
        let cidr = format!("{}/24", self.addr(octet));
        run_ok("ip", &["-n", &ns, "addr", "add", &cidr, "dev", HOST_IF]);
        run_ok("ip", &["-n", &ns, "link", "set", HOST_IF, "up"]);
        ns
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.members.iter().chain(std::iter::once(&self.switch)) {
            delete_namespace(ns);
        }
    }
}

/// SIGKILL whatever still runs in `ns` (only processes of this fixture ever do), then delete it.
fn delete_namespace(ns: &str) {
    let pids = Command::new("ip").args(["netns", "pids", ns]).output();
    let pids = pids.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    for pid in pids.unwrap_or_default().split_whitespace() {
        if let Ok(pid) = pid.parse::<libc::pid_t>() {
            // SAFETY: kill(2) on a PID that runs inside a namespace this fixture created.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

/// Whether the pid in a name made by this fixture (`<run_prefix><pid>-...`) is gone.
pub(crate) fn owner_gone(name: &str, prefix: &str) -> bool {
    let Some(pid) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.split('-').next())
        .and_then(|p| p.parse::<u32>().ok())
    else {
        return false;
    };
    pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Delete the namespaces (and kill their processes) of runs in this pid namespace that died
/// without cleaning up.
pub fn remove_leftover_namespaces() {
    let prefix = run_prefix();
    let list = sh("ip netns list");
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(&prefix) && owner_gone(name, &prefix) {
            eprintln!("removing leftover network namespace {name}");
            delete_namespace(name);
        }
    }
}

/// Why network-namespace tests cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces and iptables need root)".into());
    }
    for bin in ["ip", "iptables"] {
        if !have(bin) {
            return Some(format!(
                "{bin} missing (make test installs iproute2 and iptables)"
            ));
        }
    }
    let probe = format!("{}{}-probe", run_prefix(), std::process::id());
    let add = sh(&format!("ip netns add {probe}"));
    if !add.status.success() {
        let err = String::from_utf8_lossy(&add.stderr).trim().to_owned();
        return Some(format!("`ip netns add` does not work here: {err}"));
    }
    let ipt = sh(&format!("ip netns exec {probe} iptables -w -L -n"));
    delete_namespace(&probe);
    if !ipt.status.success() {
        let err = String::from_utf8_lossy(&ipt.stderr).trim().to_owned();
        return Some(format!("iptables does not work inside a namespace: {err}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftover_names_are_matched_by_a_dead_pid_only() {
        let p = "hawser-42-";
        assert!(!owner_gone(
            &format!("hawser-42-{}-0-sw", std::process::id()),
            p
        ));
        assert!(!owner_gone("hawser-42-1-0-sw", p), "pid 1 is alive");
        assert!(owner_gone("hawser-42-4294967295-0-sw", p), "no such pid");
        assert!(
            !owner_gone("hawser-43-4294967295-0-sw", p),
            "other pid namespace"
        );
        assert!(!owner_gone("hawser-42-x-0-sw", p));
    }
}
