//! StorageClass parameters of a CreateVolume request, checked: a typo is an error, never a
//! silently ignored setting.
//!
//! | key            | values                         | default                          |
//! |----------------|--------------------------------|----------------------------------|
//! | `replicas`     | 1-5                            | 2                                |
//! | `provisioning` | `thin`, `thick`                | `thin`                           |
//! | `pool`         | a pool name                    | any pool                         |
//! | `zoneSpread`   | `strict`, `preferred`, `none`  | strict if nodes have zones       |
//! | `locality`     | `preferred`, `none`            | `preferred`                      |
//! | `onQuorumLoss` | `suspend`, `fail`              | `suspend`                        |
//! | `encrypted`    | `true`, `false`                | `false`                          |
//! | `checksums`    | `true`, `false`                | `true`                           |
//! | `iopsLimit`, `readIopsLimit`, `writeIopsLimit` | requests per second | no limit      |
//! | `bandwidthLimit`, `readBandwidthLimit`, `writeBandwidthLimit` | bytes per second, `100MiB` | no limit |
//! | `backupTarget`, `backupCron`, `backupRetain` | a backup target, a cron (UTC), backups kept | no schedule |
//!
//! The limits (QoS, `hawser_api::qos`) are also the volume's mutable parameters: a
//! VolumeAttributesClass may set them at create and change them later (ControllerModifyVolume);
//! `0` removes one.
//!
//! The three `backup*` keys go together: each volume of the class is created with a backup
//! schedule (docs/backup.md), which `hawser backup schedule` can change later. The controller
//! checks the target and the cron before it creates anything, so a typo fails the claim and
//! leaves no volume.
//!
//! `locality: preferred` puts one replica on the node Kubernetes picked for the pod (the
//! first preferred topology segment, set with `volumeBindingMode: WaitForFirstConsumer`), so
//! the pod's reads are local. Keys under `csi.storage.k8s.io/` belong to the provisioner
//! sidecar and are ignored.

use std::collections::HashMap;

use hawser_api::backup::NewBackupSchedule;
use hawser_api::controller::{CreateVolume, QuorumLoss, ZoneSpread, DEFAULT_CHECKSUMS};
use hawser_api::{Qos, QosField, QosPatch};

/// Keys the provisioner sidecar adds or reserves.
const SIDECAR_PREFIX: &str = "csi.storage.k8s.io/";
const KEYS: &[&str] = &[
    "replicas",
    "frontend",
    "provisioning",
    "pool",
    "zoneSpread",
    "locality",
    "onQuorumLoss",
    "encrypted",
    "checksums",
    "iopsLimit",
    "readIopsLimit",
    "writeIopsLimit",
    "bandwidthLimit",
    "readBandwidthLimit",
    "writeBandwidthLimit",
    "backupTarget",
    "backupCron",
    "backupRetain",
];
pub const DEFAULT_REPLICAS: u32 = 2;
/// The `replicas` parameter's bound: the controller's (the API's one definition).
pub use hawser_api::controller::MAX_VOLUME_REPLICAS as MAX_REPLICAS;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeParams {
    pub replicas: u32,
    pub thin: bool,
    pub pool: Option<String>,
    pub zone_spread: Option<ZoneSpread>,
    pub locality: bool,
    pub on_quorum_loss: QuorumLoss,
    pub qos: Qos,
    pub encrypted: bool,
    /// Block checksums (a CRC-32C per 4 KiB block, checked on every read).
    pub checksums: bool,
    /// How nodes make the volume a block device (passed to NodeStage in the volume context).
    pub frontend: Frontend,
    /// Back each volume up on this schedule.
    pub backup_schedule: Option<NewBackupSchedule>,
}

/// How a node makes a volume a block device: `auto` picks the best the node has (ublk, then
/// kernel NBD, both served by the agent and surviving its restarts; then nbdfuse with a loop
/// device, which does not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Frontend {
    #[default]
    Auto,
    Ublk,
    Nbd,
    Fuse,
}

impl Frontend {
    pub const CONTEXT_KEY: &'static str = "frontend";

    pub fn parse(s: &str) -> Option<Frontend> {
        Some(match s {
            "auto" => Frontend::Auto,
            "ublk" => Frontend::Ublk,
            "nbd" => Frontend::Nbd,
            "fuse" => Frontend::Fuse,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Frontend::Auto => "auto",
            Frontend::Ublk => "ublk",
            Frontend::Nbd => "nbd",
            Frontend::Fuse => "fuse",
        }
    }
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Frontend {
    type Err = String;
    fn from_str(s: &str) -> Result<Frontend, String> {
        Frontend::parse(s).ok_or_else(|| format!("{s:?}: expected auto, ublk, nbd or fuse"))
    }
}

impl Default for VolumeParams {
    fn default() -> Self {
        VolumeParams {
            replicas: DEFAULT_REPLICAS,
            thin: true,
            pool: None,
            zone_spread: None,
            locality: true,
            on_quorum_loss: QuorumLoss::Suspend,
            qos: Qos::default(),
            encrypted: false,
            checksums: DEFAULT_CHECKSUMS,
            frontend: Frontend::Auto,
            backup_schedule: None,
        }
    }
}

/// Parses the parameters; the error names the key and what it takes.
pub fn parse(params: &HashMap<String, String>) -> Result<VolumeParams, String> {
    let mut p = VolumeParams::default();
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        let value = params[key].as_str();
        let bad = |takes: &str| format!("parameter {key}={value:?}: {takes}");
        match key.as_str() {
            "backupTarget" | "backupCron" | "backupRetain" => {}
            "replicas" => {
                p.replicas = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_REPLICAS).contains(n))
                    .ok_or_else(|| bad(&format!("a number of replicas from 1 to {MAX_REPLICAS}")))?
            }
            "provisioning" => {
                p.thin = match value {
                    "thin" => true,
                    "thick" => false,
                    _ => return Err(bad("thin or thick")),
                }
            }
            "pool" => {
                hawser_api::validate_name("pool", value).map_err(|e| bad(&e.message))?;
                p.pool = Some(value.to_string());
            }
            "zoneSpread" => {
                p.zone_spread = Some(match value {
                    "strict" => ZoneSpread::Strict,
                    "preferred" => ZoneSpread::Preferred,
                    "none" => ZoneSpread::None,
                    _ => return Err(bad("strict, preferred or none")),
                })
            }
            "locality" => {
                p.locality = match value {
                    "preferred" => true,
                    "none" => false,
                    _ => return Err(bad("preferred or none")),
                }
            }
            "onQuorumLoss" => {
                p.on_quorum_loss = match value {
                    "suspend" => QuorumLoss::Suspend,
                    "fail" => QuorumLoss::Fail,
                    _ => return Err(bad("suspend or fail")),
                }
            }
            "frontend" => {
                p.frontend = Frontend::parse(value).ok_or_else(|| bad("auto, ublk, nbd or fuse"))?
            }
            "encrypted" => {
                p.encrypted = match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("true or false")),
                }
            }
            "checksums" => {
                p.checksums = match value {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad("true or false")),
                }
            }
            k if limit(k).is_some() => {
                let patch = parse_limit(key, value)?;
                p.qos = p.qos.patched(&patch);
            }
            k if k.starts_with(SIDECAR_PREFIX) => {}
            _ => {
                return Err(format!(
                    "unknown parameter {key:?}; Hawser's StorageClass parameters are {}",
                    KEYS.join(", ")
                ))
            }
        }
    }
    p.backup_schedule = backup_schedule(params)?;
    Ok(p)
}

/// The `backup*` keys: all three or none.
fn backup_schedule(params: &HashMap<String, String>) -> Result<Option<NewBackupSchedule>, String> {
    let get = |k: &str| params.get(k).map(String::as_str);
    match (get("backupTarget"), get("backupCron"), get("backupRetain")) {
        (None, None, None) => Ok(None),
        (Some(target), Some(cron), Some(retain)) => {
            hawser_api::validate_name("backup target", target)
                .map_err(|e| format!("parameter backupTarget={target:?}: {}", e.message))?;
            let retain = retain.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                format!("parameter backupRetain={retain:?}: a number of backups to keep, 1 or more")
            })?;
            Ok(Some(NewBackupSchedule {
                target: target.to_string(),
                cron: cron.to_string(),
                retain,
            }))
        }
        _ => Err(
            "parameters backupTarget, backupCron and backupRetain go together: a \
                  schedule needs a target, a cron and how many backups to keep"
                .to_string(),
        ),
    }
}

/// The limit a parameter sets, if it names one.
fn limit(key: &str) -> Option<QosField> {
    QosField::ALL.into_iter().find(|f| f.csi_parameter() == key)
}

fn parse_limit(key: &str, value: &str) -> Result<QosPatch, String> {
    let field = limit(key).ok_or_else(|| format!("{key:?} is not a limit"))?;
    let v = field
        .parse(value)
        .map_err(|e| format!("parameter {key}={value:?}: {e}"))?;
    let mut patch = QosPatch::default();
    patch.set(field, v);
    Ok(patch)
}

/// Parses mutable parameters (a VolumeAttributesClass's, at create or in ControllerModifyVolume):
/// only the limits, each given replacing the volume's.
pub fn parse_mutable(params: &HashMap<String, String>) -> Result<QosPatch, String> {
    let mut patch = QosPatch::default();
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort();
    for key in keys {
        if limit(key).is_none() {
            let names: Vec<&str> = QosField::ALL.iter().map(|f| f.csi_parameter()).collect();
            return Err(format!(
                "unknown mutable parameter {key:?}; Hawser's are {}",
                names.join(", ")
            ));
        }
        let one = parse_limit(key, &params[key])?;
        for (field, v) in one.fields() {
            if let Some(v) = v {
                patch.set(field, v);
            }
        }
    }
    Ok(patch)
}

impl VolumeParams {
    /// The controller API request for a volume of `size_bytes` named `id`; `node` is the node
    /// the pod will run on, when Kubernetes said.
    pub fn create_request(&self, id: &str, size_bytes: u64, node: Option<&str>) -> CreateVolume {
        CreateVolume {
            name: id.to_string(),
            size_bytes,
            replicas: self.replicas,
            thin: self.thin,
            pool: self.pool.clone(),
            zone_spread: self.zone_spread,
            prefer_node: node.filter(|_| self.locality).map(str::to_string),
            on_quorum_loss: self.on_quorum_loss,
            from: None,
            qos: self.qos,
            encrypted: self.encrypted,
            checksums: Some(self.checksums),
            from_backup: None,
            standby_of: None,
            backup_schedules: self.backup_schedule.iter().cloned().collect(),
        }
    }

    /// Why an existing volume does not match these parameters, if it does not.
    pub fn mismatch(&self, v: &hawser_api::controller::Volume) -> Option<String> {
        if v.replica_count != self.replicas {
            return Some(format!(
                "it has {} replicas, {} asked",
                v.replica_count, self.replicas
            ));
        }
        if v.thin != self.thin {
            return Some(format!("it is {}", if v.thin { "thin" } else { "thick" }));
        }
        if self.pool.is_some() && v.placement.pool != self.pool {
            return Some(format!("its pool is {:?}", v.placement.pool));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn known_keys_parse_and_sidecar_keys_are_ignored() {
        let p = parse(&map(&[
            ("replicas", "3"),
            ("provisioning", "thick"),
            ("pool", "ssd"),
            ("zoneSpread", "preferred"),
            ("locality", "none"),
            ("onQuorumLoss", "fail"),
            ("checksums", "false"),
            ("frontend", "nbd"),
            ("csi.storage.k8s.io/pvc/name", "data"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p,
            VolumeParams {
                replicas: 3,
                thin: false,
                pool: Some("ssd".into()),
                zone_spread: Some(ZoneSpread::Preferred),
                locality: false,
                on_quorum_loss: QuorumLoss::Fail,
                qos: Qos::default(),
                encrypted: false,
                checksums: false,
                frontend: Frontend::Nbd,
                backup_schedule: None,
            }
        );
        let bad = parse(&map(&[("frontend", "floppy")]));
        assert!(
            bad.as_ref()
                .is_err_and(|e| e.contains("auto, ublk, nbd or fuse")),
            "{bad:?}"
        );
        assert_eq!(parse(&map(&[])), Ok(VolumeParams::default()));
        let req = VolumeParams::default().create_request("v", 4096, Some("n1"));
        assert_eq!(req.prefer_node.as_deref(), Some("n1"));
        assert_eq!(p.create_request("v", 4096, Some("n1")).prefer_node, None);
    }

    #[test]
    fn limits_are_parameters_and_the_only_mutable_ones() {
        let p = parse(&map(&[
            ("writeIopsLimit", "1000"),
            ("bandwidthLimit", "100MiB"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.qos,
            Qos {
                write_iops: 1000,
                bytes_per_sec: 100 << 20,
                ..Qos::default()
            }
        );
        assert_eq!(p.create_request("v", 4096, None).qos, p.qos);
        let m = parse_mutable(&map(&[("readIopsLimit", "0"), ("iopsLimit", "50")]))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (m.read_iops, m.iops, m.write_iops),
            (Some(0), Some(50), None)
        );
        assert!(parse_mutable(&map(&[])).is_ok_and(|m| m.is_empty()));
        for bad in [
            map(&[("replicas", "3")]),
            map(&[("XXX_FakeKey", "XXX_FakeValue")]),
            map(&[("iopsLimit", "many")]),
            map(&[("bandwidthLimit", "10")]),
        ] {
            assert!(parse_mutable(&bad).is_err(), "{bad:?}");
        }
        let e = parse(&map(&[("writeBandwidthLimit", "fast")]))
            .err()
            .unwrap_or_default();
        assert!(e.contains("writeBandwidthLimit"), "{e}");
    }

    #[test]
    fn bad_values_and_unknown_keys_are_refused_with_their_name() {
        for (k, v) in [
            ("replicas", "0"),
            ("replicas", "6"),
            ("replicas", "two"),
            ("provisioning", "fat"),
            ("pool", "Bad_Name"),
            ("zoneSpread", "yes"),
            ("locality", "strict"),
            ("onQuorumLoss", "panic"),
            ("checksums", "yes"),
            ("checksums", "off"),
            ("replica", "2"),
        ] {
            let e = parse(&map(&[(k, v)])).expect_err(k);
            assert!(e.contains(k), "{e}");
        }
    }

    /// A StorageClass's schedule reaches the create request whole; a part of one is refused,
    /// naming all three keys, and so is a bad target name or count.
    #[test]
    fn a_backup_schedule_takes_all_three_keys() {
        let p = parse(&map(&[
            ("backupTarget", "s3"),
            ("backupCron", "0 * * * *"),
            ("backupRetain", "24"),
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            p.create_request("v", 4096, None).backup_schedules,
            vec![NewBackupSchedule {
                target: "s3".into(),
                cron: "0 * * * *".into(),
                retain: 24,
            }]
        );
        assert!(parse(&map(&[])).is_ok_and(|p| p
            .create_request("v", 4096, None)
            .backup_schedules
            .is_empty()));
        for part in [
            map(&[("backupTarget", "s3")]),
            map(&[("backupCron", "0 * * * *"), ("backupRetain", "24")]),
        ] {
            let e = parse(&part).expect_err("a part of a schedule");
            assert!(
                e.contains("backupTarget, backupCron and backupRetain"),
                "{e}"
            );
        }
        for (k, v) in [
            ("backupTarget", "Bad_Name"),
            ("backupRetain", "0"),
            ("backupRetain", "many"),
        ] {
            let mut m = map(&[
                ("backupTarget", "s3"),
                ("backupCron", "0 * * * *"),
                ("backupRetain", "24"),
            ]);
            m.insert(k.into(), v.into());
            let e = parse(&m).expect_err(k);
            assert!(e.contains(k), "{e}");
        }
    }

    /// Block checksums are on unless the StorageClass turns them off, and the request says
    /// so either way (the controller's own default never decides for a CSI volume).
    #[test]
    fn checksums_default_on_and_reach_the_create_request() {
        let on = parse(&map(&[])).unwrap_or_else(|e| panic!("{e}"));
        assert!(on.checksums);
        assert_eq!(on.create_request("v", 4096, None).checksums, Some(true));
        let on = parse(&map(&[("checksums", "true")])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(on.create_request("v", 4096, None).checksums, Some(true));
        let off = parse(&map(&[("checksums", "false")])).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(off.create_request("v", 4096, None).checksums, Some(false));
        let e = parse(&map(&[("checksums", "TRUE")]))
            .err()
            .unwrap_or_default();
        assert_eq!(e, "parameter checksums=\"TRUE\": true or false");
    }
}
