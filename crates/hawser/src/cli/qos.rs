//! The limit flags of `hawser volume create` and `hawser volume set` (QoS; `hawser_api::qos`).

use hawser_api::controller::Volume;
use hawser_api::{Qos, QosField, QosPatch};

/// Caps on a volume's client requests; 0 removes one. Resync and copies are not counted.
#[derive(Debug, Default, clap::Args)]
pub struct QosArgs {
    /// Reads and writes per second together.
    #[arg(long, value_parser = |s: &str| QosField::Iops.parse(s))]
    iops_limit: Option<u64>,
    /// Reads per second.
    #[arg(long, value_parser = |s: &str| QosField::ReadIops.parse(s))]
    read_iops_limit: Option<u64>,
    /// Writes (and trims, zeroings) per second.
    #[arg(long, value_parser = |s: &str| QosField::WriteIops.parse(s))]
    write_iops_limit: Option<u64>,
    /// Bytes read and written per second together, e.g. 200MiB.
    #[arg(long, value_parser = |s: &str| QosField::Bytes.parse(s))]
    bandwidth_limit: Option<u64>,
    /// Bytes read per second, e.g. 200MiB.
    #[arg(long, value_parser = |s: &str| QosField::ReadBytes.parse(s))]
    read_bandwidth_limit: Option<u64>,
    /// Bytes written per second, e.g. 200MiB.
    #[arg(long, value_parser = |s: &str| QosField::WriteBytes.parse(s))]
    write_bandwidth_limit: Option<u64>,
}

impl QosArgs {
    /// The limits given, the others left out.
    pub fn patch(&self) -> QosPatch {
        QosPatch {
            read_iops: self.read_iops_limit,
            write_iops: self.write_iops_limit,
            iops: self.iops_limit,
            read_bytes_per_sec: self.read_bandwidth_limit,
            write_bytes_per_sec: self.write_bandwidth_limit,
            bytes_per_sec: self.bandwidth_limit,
        }
    }

    /// The limits of a new volume: those given, none otherwise.
    pub fn qos(&self) -> Qos {
        Qos::default().patched(&self.patch())
    }
}

/// "write 1000 IOPS", with whether the engine's node applies them yet when it said.
pub fn describe(v: &Volume) -> Option<String> {
    let live = v.engine.as_ref().map(|e| e.qos);
    if v.qos.is_unlimited() && live.is_none_or(|q| q.is_unlimited()) {
        return None;
    }
    let mut s = v.qos.describe();
    match (live, &v.attached_node) {
        (Some(q), Some(node)) if q == v.qos => s.push_str(&format!(" (applied on {node})")),
        (Some(q), Some(node)) => s.push_str(&format!(
            " ({node} still applies {}; it gets the new ones within seconds)",
            q.describe()
        )),
        _ => {}
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        qos: QosArgs,
    }

    #[test]
    fn flags_parse_into_a_patch_of_only_what_was_given() {
        let cli = Cli::try_parse_from([
            "x",
            "--write-iops-limit",
            "1000",
            "--bandwidth-limit",
            "100MiB/s",
            "--read-iops-limit",
            "0",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let p = cli.qos.patch();
        assert_eq!(p.write_iops, Some(1000));
        assert_eq!(p.bytes_per_sec, Some(100 << 20));
        assert_eq!(p.read_iops, Some(0));
        assert_eq!(p.iops, None);
        assert_eq!(cli.qos.qos().write_iops, 1000);
        for bad in [
            ["x", "--iops-limit", "lots"],
            ["x", "--bandwidth-limit", "100"],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }
}
