//! Which CSI volume capabilities Hawser serves: one node at a time (the volume's engine runs
//! on the node it is attached to), as a filesystem (ext4 or xfs) or as a raw block device.

use tonic::Status;

use crate::proto::csi::volume_capability::access_mode::Mode;
use crate::proto::csi::volume_capability::AccessType;
use crate::proto::csi::VolumeCapability;

/// Filesystems the node service makes and mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsType {
    Ext4,
    Xfs,
}

impl FsType {
    pub fn name(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Xfs => "xfs",
        }
    }
}

/// How a volume is used, from one capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    Mount { fs: FsType, flags: Vec<String> },
    Block,
}

impl Access {
    pub fn is_block(&self) -> bool {
        matches!(self, Access::Block)
    }
}

/// Checks one capability; the error says what Hawser supports instead.
pub fn check(cap: &VolumeCapability) -> Result<Access, String> {
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| m.mode())
        .ok_or("the volume capability has no access mode")?;
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => {}
        Mode::Unknown => return Err("the volume capability's access mode is UNKNOWN".into()),
        other => {
            return Err(format!(
                "access mode {} is not supported: a Hawser volume is used on one node at a \
                 time (ReadWriteOnce / ReadWriteOncePod)",
                other.as_str_name()
            ))
        }
    }
    match &cap.access_type {
        Some(AccessType::Block(_)) => Ok(Access::Block),
        Some(AccessType::Mount(m)) => {
            let fs = match m.fs_type.as_str() {
                "" | "ext4" => FsType::Ext4,
                "xfs" => FsType::Xfs,
                other => {
                    return Err(format!(
                        "filesystem type {other:?} is not supported: use ext4 (the default) \
                         or xfs"
                    ))
                }
            };
            if let Some(bad) = m
                .mount_flags
                .iter()
                .find(|f| f.is_empty() || f.contains(','))
            {
                return Err(format!(
                    "mount flag {bad:?} is not one option: give each option as its own flag"
                ));
            }
            Ok(Access::Mount {
                fs,
                flags: m.mount_flags.clone(),
            })
        }
        None => Err("the volume capability has neither a mount nor a block access type".into()),
    }
}

/// Checks a request's capabilities: at least one, all supported.
pub fn check_all(caps: &[VolumeCapability]) -> Result<Vec<Access>, Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument("volume_capabilities is required"));
    }
    caps.iter()
        .map(|c| check(c).map_err(Status::invalid_argument))
        .collect()
}

/// The one capability a request must carry (`volume_capability`).
pub fn check_required(cap: Option<&VolumeCapability>) -> Result<Access, Status> {
    let cap = cap.ok_or_else(|| Status::invalid_argument("volume_capability is required"))?;
    check(cap).map_err(Status::invalid_argument)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::proto::csi::volume_capability::{AccessMode, BlockVolume, MountVolume};

    pub fn cap(mode: Mode, access: Option<AccessType>) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode.into() }),
            access_type: access,
        }
    }

    pub fn mount(fs: &str) -> Option<AccessType> {
        Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn single_node_mount_and_block_are_served_the_rest_is_refused() {
        let ok = check(&cap(Mode::SingleNodeWriter, mount(""))).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ok,
            Access::Mount {
                fs: FsType::Ext4,
                flags: vec![]
            }
        );
        let block = Some(AccessType::Block(BlockVolume {}));
        assert_eq!(
            check(&cap(Mode::SingleNodeReaderOnly, block)),
            Ok(Access::Block)
        );
        assert!(check(&cap(Mode::SingleNodeWriter, mount("xfs"))).is_ok());
        for bad in [
            cap(Mode::MultiNodeMultiWriter, mount("ext4")),
            cap(Mode::SingleNodeWriter, mount("btrfs")),
            cap(Mode::SingleNodeWriter, None),
            cap(Mode::Unknown, mount("ext4")),
            VolumeCapability::default(),
        ] {
            assert!(check(&bad).is_err(), "{bad:?}");
        }
        assert!(check_all(&[]).is_err());
    }
}
