//! Per-volume I/O limits (QoS): caps on a volume's client requests per second and bytes per
//! second, for reads, writes and both together. The volume's engine node enforces them on
//! requests from the volume's users (`hawser-agent` `qos.rs`); resync, recovery and snapshot
//! copies are not client requests and are not counted. Zero means no limit of that kind.

use serde::{Deserialize, Serialize};

use crate::ApiError;

/// Smallest bandwidth limit: one 4 KiB block a second. Anything lower is a typo (a limit in
/// bytes that was meant in KiB or MiB), not a setting anyone wants.
pub const MIN_BYTES_PER_SEC: u64 = 4096;

/// A volume's limits; every field zero (the default) is no limit at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Qos {
    /// Reads per second.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub read_iops: u64,
    /// Writes, trims and zeroings per second.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub write_iops: u64,
    /// Reads and writes per second together.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub iops: u64,
    /// Bytes read per second.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub read_bytes_per_sec: u64,
    /// Bytes written per second (trims and zeroings move no data and count none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub write_bytes_per_sec: u64,
    /// Bytes read and written per second together.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_per_sec: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Qos {
    pub fn is_unlimited(&self) -> bool {
        *self == Qos::default()
    }

    /// The limits by name, as the CLI's flags and the CSI parameters call them.
    pub fn fields(&self) -> [(QosField, u64); 6] {
        QosField::ALL.map(|f| (f, f.get(self)))
    }

    /// Refuses a bandwidth limit below [`MIN_BYTES_PER_SEC`] (zero aside).
    pub fn validate(&self) -> Result<(), ApiError> {
        for (field, value) in self.fields() {
            if field.is_bytes() && value != 0 && value < MIN_BYTES_PER_SEC {
                return Err(ApiError::invalid(format!(
                    "{} of {value} bytes/s is below {MIN_BYTES_PER_SEC} bytes/s (4KiB/s): \
                     give a unit, like 100MiB (0 removes the limit)",
                    field.flag()
                )));
            }
        }
        Ok(())
    }

    /// These limits with `patch`'s given fields replaced.
    pub fn patched(&self, patch: &QosPatch) -> Qos {
        let mut q = *self;
        for (field, value) in patch.fields() {
            if let Some(v) = value {
                field.set(&mut q, v);
            }
        }
        q
    }

    /// "read 1000 IOPS, write 100MiB/s", or "none".
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .fields()
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|(f, v)| f.describe(v))
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }
}

/// `POST /v1/volumes/{name}/qos`: the limits to change; fields left out keep their value, and
/// zero removes a limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes_per_sec: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_sec: Option<u64>,
}

impl QosPatch {
    pub fn fields(&self) -> [(QosField, Option<u64>); 6] {
        [
            (QosField::ReadIops, self.read_iops),
            (QosField::WriteIops, self.write_iops),
            (QosField::Iops, self.iops),
            (QosField::ReadBytes, self.read_bytes_per_sec),
            (QosField::WriteBytes, self.write_bytes_per_sec),
            (QosField::Bytes, self.bytes_per_sec),
        ]
    }

    pub fn is_empty(&self) -> bool {
        self.fields().iter().all(|(_, v)| v.is_none())
    }

    pub fn set(&mut self, field: QosField, value: u64) {
        let slot = match field {
            QosField::ReadIops => &mut self.read_iops,
            QosField::WriteIops => &mut self.write_iops,
            QosField::Iops => &mut self.iops,
            QosField::ReadBytes => &mut self.read_bytes_per_sec,
            QosField::WriteBytes => &mut self.write_bytes_per_sec,
            QosField::Bytes => &mut self.bytes_per_sec,
        };
        *slot = Some(value);
    }
}

/// One kind of limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosField {
    ReadIops,
    WriteIops,
    Iops,
    ReadBytes,
    WriteBytes,
    Bytes,
}

impl QosField {
    pub const ALL: [QosField; 6] = [
        QosField::ReadIops,
        QosField::WriteIops,
        QosField::Iops,
        QosField::ReadBytes,
        QosField::WriteBytes,
        QosField::Bytes,
    ];

    pub fn is_bytes(self) -> bool {
        matches!(
            self,
            QosField::ReadBytes | QosField::WriteBytes | QosField::Bytes
        )
    }

    pub fn get(self, q: &Qos) -> u64 {
        match self {
            QosField::ReadIops => q.read_iops,
            QosField::WriteIops => q.write_iops,
            QosField::Iops => q.iops,
            QosField::ReadBytes => q.read_bytes_per_sec,
            QosField::WriteBytes => q.write_bytes_per_sec,
            QosField::Bytes => q.bytes_per_sec,
        }
    }

    fn set(self, q: &mut Qos, v: u64) {
        let slot = match self {
            QosField::ReadIops => &mut q.read_iops,
            QosField::WriteIops => &mut q.write_iops,
            QosField::Iops => &mut q.iops,
            QosField::ReadBytes => &mut q.read_bytes_per_sec,
            QosField::WriteBytes => &mut q.write_bytes_per_sec,
            QosField::Bytes => &mut q.bytes_per_sec,
        };
        *slot = v;
    }

    /// The CLI flag (without `--`).
    pub fn flag(self) -> &'static str {
        match self {
            QosField::ReadIops => "read-iops-limit",
            QosField::WriteIops => "write-iops-limit",
            QosField::Iops => "iops-limit",
            QosField::ReadBytes => "read-bandwidth-limit",
            QosField::WriteBytes => "write-bandwidth-limit",
            QosField::Bytes => "bandwidth-limit",
        }
    }

    /// The CSI StorageClass / VolumeAttributesClass parameter.
    pub fn csi_parameter(self) -> &'static str {
        match self {
            QosField::ReadIops => "readIopsLimit",
            QosField::WriteIops => "writeIopsLimit",
            QosField::Iops => "iopsLimit",
            QosField::ReadBytes => "readBandwidthLimit",
            QosField::WriteBytes => "writeBandwidthLimit",
            QosField::Bytes => "bandwidthLimit",
        }
    }

    /// Parses a value of this kind: a count for IOPS, bytes with an optional unit and "/s"
    /// for bandwidth ("100MiB", "1GiB/s"); "0" is no limit.
    pub fn parse(self, input: &str) -> Result<u64, String> {
        let s = input.trim();
        let value = if self.is_bytes() {
            crate::parse_bytes(s.strip_suffix("/s").unwrap_or(s)).map_err(|e| {
                format!("{input:?} is not bytes per second like 100MiB or 1GiB/s: {e}")
            })?
        } else {
            s.parse::<u64>()
                .map_err(|_| format!("{input:?} is not a number of requests per second"))?
        };
        let mut q = Qos::default();
        self.set(&mut q, value);
        q.validate().map_err(|e| e.message)?;
        Ok(value)
    }

    fn describe(self, v: u64) -> String {
        let what = match self {
            QosField::ReadIops | QosField::ReadBytes => "read ",
            QosField::WriteIops | QosField::WriteBytes => "write ",
            QosField::Iops | QosField::Bytes => "",
        };
        if self.is_bytes() {
            format!("{what}{}/s", crate::format_size(v))
        } else {
            format!("{what}{v} IOPS")
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_patch_changes_only_what_it_names_and_zero_removes() {
        let q = Qos {
            write_iops: 1000,
            bytes_per_sec: 1 << 20,
            ..Qos::default()
        };
        let p = QosPatch {
            write_iops: Some(2000),
            read_iops: Some(5),
            bytes_per_sec: Some(0),
            ..QosPatch::default()
        };
        assert_eq!(
            q.patched(&p),
            Qos {
                write_iops: 2000,
                read_iops: 5,
                ..Qos::default()
            }
        );
        assert_eq!(q.patched(&QosPatch::default()), q);
        assert!(QosPatch::default().is_empty() && !p.is_empty());
    }

    #[test]
    fn values_parse_by_kind_and_tiny_bandwidths_are_refused() {
        assert_eq!(QosField::WriteIops.parse("1000"), Ok(1000));
        assert_eq!(QosField::Bytes.parse("100MiB"), Ok(100 << 20));
        assert_eq!(QosField::ReadBytes.parse("1GiB/s"), Ok(1 << 30));
        assert_eq!(QosField::Bytes.parse("0"), Ok(0));
        assert!(QosField::Iops.parse("1k").is_err());
        assert!(QosField::Iops.parse("-1").is_err());
        let e = QosField::Bytes.parse("100").err().unwrap_or_default();
        assert!(e.contains("bandwidth-limit") && e.contains("4096"), "{e}");
        assert!(Qos {
            read_bytes_per_sec: 4095,
            ..Qos::default()
        }
        .validate()
        .is_err());
    }

    #[test]
    fn unlimited_serializes_to_nothing_and_descriptions_name_each_limit() {
        assert_eq!(serde_json::to_string(&Qos::default()).unwrap(), "{}");
        let q: Qos = serde_json::from_str(r#"{"write_iops":1000}"#).unwrap();
        assert_eq!(q.describe(), "write 1000 IOPS");
        assert_eq!(Qos::default().describe(), "none");
        let q = Qos {
            iops: 10,
            read_bytes_per_sec: 1 << 20,
            ..Qos::default()
        };
        assert_eq!(q.describe(), "10 IOPS, read 1 MiB/s");
        assert!(serde_json::from_str::<Qos>(r#"{"iops_limit":1}"#).is_err());
    }
}
