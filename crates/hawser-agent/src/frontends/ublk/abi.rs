//! The ublk driver's user ABI (`include/uapi/linux/ublk_cmd.h`), encoded and decoded by hand:
//! the few structs Hawser uses, as byte arrays, so no bindgen or libclang is needed to build.
//! Decoders take whatever the kernel (or a test) hands them and never panic.

/// `_IOWR('u', nr, size)`: the ioctl-style command encoding, which every kernel with ublk
/// accepts (the legacy bare numbers can be configured out).
const fn iowr(nr: u32, size: u32) -> u32 {
    (3 << 30) | (size << 16) | ((b'u' as u32) << 8) | nr
}

const CTRL_CMD_BYTES: u32 = 32;
const IO_CMD_BYTES: u32 = 16;

pub const CMD_GET_DEV_INFO: u32 = iowr(0x02, CTRL_CMD_BYTES);
pub const CMD_ADD_DEV: u32 = iowr(0x04, CTRL_CMD_BYTES);
pub const CMD_DEL_DEV: u32 = iowr(0x05, CTRL_CMD_BYTES);
pub const CMD_START_DEV: u32 = iowr(0x06, CTRL_CMD_BYTES);
pub const CMD_STOP_DEV: u32 = iowr(0x07, CTRL_CMD_BYTES);
pub const CMD_SET_PARAMS: u32 = iowr(0x08, CTRL_CMD_BYTES);
pub const CMD_START_USER_RECOVERY: u32 = iowr(0x10, CTRL_CMD_BYTES);
pub const CMD_END_USER_RECOVERY: u32 = iowr(0x11, CTRL_CMD_BYTES);
pub const CMD_GET_FEATURES: u32 = iowr(0x13, CTRL_CMD_BYTES);
/// Deletes without waiting for the last opener of the block device (Linux 6.9).
pub const CMD_DEL_DEV_ASYNC: u32 = iowr(0x14, CTRL_CMD_BYTES);
/// Changes a live device's size (Linux 6.16; [`F_UPDATE_SIZE`]).
pub const CMD_UPDATE_SIZE: u32 = iowr(0x15, CTRL_CMD_BYTES);

pub const IO_FETCH_REQ: u32 = iowr(0x20, IO_CMD_BYTES);
pub const IO_COMMIT_AND_FETCH_REQ: u32 = iowr(0x21, IO_CMD_BYTES);

/// A fetch or commit completed with a new request in the tag's descriptor.
pub const IO_RES_OK: i32 = 0;
/// The queue is going away (the device stops, or the daemon is being replaced).
pub const IO_RES_ABORT: i32 = -libc::ENODEV;

/// When the server dies, hold I/O until a new server takes the device back.
pub const F_USER_RECOVERY: u64 = 1 << 3;
/// ... and give the new server every request the dead one had taken.
pub const F_USER_RECOVERY_REISSUE: u64 = 1 << 4;
pub const F_CMD_IOCTL_ENCODE: u64 = 1 << 6;
pub const F_UPDATE_SIZE: u64 = 1 << 10;

pub const S_DEV_DEAD: u16 = 0;
pub const S_DEV_LIVE: u16 = 1;
pub const S_DEV_QUIESCED: u16 = 2;

pub const OP_READ: u8 = 0;
pub const OP_WRITE: u8 = 1;
pub const OP_FLUSH: u8 = 2;
pub const OP_DISCARD: u8 = 3;
pub const OP_WRITE_ZEROES: u8 = 5;
pub const IO_F_FUA: u32 = 1 << 13;
pub const IO_F_NOUNMAP: u32 = 1 << 15;

pub const ATTR_VOLATILE_CACHE: u32 = 1 << 2;
pub const ATTR_FUA: u32 = 1 << 3;
pub const PARAM_TYPE_BASIC: u32 = 1 << 0;
pub const PARAM_TYPE_DISCARD: u32 = 1 << 1;

/// Bytes of one I/O descriptor in the per-queue area the server maps.
pub const IO_DESC_BYTES: usize = 24;

fn u16_at(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u16::from_ne_bytes)
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_ne_bytes)
}

/// `struct ublksrv_ctrl_cmd`, the 32 bytes at the start of a control SQE's command area.
#[derive(Clone, Copy, Debug, Default)]
pub struct CtrlCmd {
    pub dev_id: u32,
    pub queue_id: u16,
    pub len: u16,
    pub addr: u64,
    pub data: u64,
}

impl CtrlCmd {
    pub fn for_device(dev_id: u32) -> CtrlCmd {
        CtrlCmd {
            dev_id,
            queue_id: u16::MAX,
            ..CtrlCmd::default()
        }
    }

    pub fn encode(&self) -> [u8; 80] {
        let mut b = [0u8; 80];
        b[0..4].copy_from_slice(&self.dev_id.to_ne_bytes());
        b[4..6].copy_from_slice(&self.queue_id.to_ne_bytes());
        b[6..8].copy_from_slice(&self.len.to_ne_bytes());
        b[8..16].copy_from_slice(&self.addr.to_ne_bytes());
        b[16..24].copy_from_slice(&self.data.to_ne_bytes());
        b
    }
}

/// `struct ublksrv_ctrl_dev_info` (64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevInfo {
    pub nr_hw_queues: u16,
    pub queue_depth: u16,
    pub state: u16,
    pub max_io_buf_bytes: u32,
    pub dev_id: u32,
    pub ublksrv_pid: i32,
    pub flags: u64,
    /// Kept by the kernel for the server, never read by it: Hawser stores whose device this
    /// is ([`super::owner_tag`]).
    pub ublksrv_flags: u64,
}

pub const DEV_INFO_BYTES: usize = 64;
/// The same, as a command's `len`.
pub const DEV_INFO_LEN: u16 = 64;

impl DevInfo {
    pub fn encode(&self) -> [u8; DEV_INFO_BYTES] {
        let mut b = [0u8; DEV_INFO_BYTES];
        b[0..2].copy_from_slice(&self.nr_hw_queues.to_ne_bytes());
        b[2..4].copy_from_slice(&self.queue_depth.to_ne_bytes());
        b[4..6].copy_from_slice(&self.state.to_ne_bytes());
        b[8..12].copy_from_slice(&self.max_io_buf_bytes.to_ne_bytes());
        b[12..16].copy_from_slice(&self.dev_id.to_ne_bytes());
        b[16..20].copy_from_slice(&self.ublksrv_pid.to_ne_bytes());
        b[24..32].copy_from_slice(&self.flags.to_ne_bytes());
        b[32..40].copy_from_slice(&self.ublksrv_flags.to_ne_bytes());
        b
    }

    /// Short input reads as zeroes (the fields a shorter struct of an older kernel lacks).
    pub fn decode(b: &[u8]) -> DevInfo {
        DevInfo {
            nr_hw_queues: u16_at(b, 0),
            queue_depth: u16_at(b, 2),
            state: u16_at(b, 4),
            max_io_buf_bytes: u32_at(b, 8),
            dev_id: u32_at(b, 12),
            ublksrv_pid: u32_at(b, 16) as i32,
            flags: u64_at(b, 24),
            ublksrv_flags: u64_at(b, 32),
        }
    }
}

/// `struct ublk_params` with the basic and discard parts: what `SET_PARAMS` takes.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub dev_sectors: u64,
    pub max_sectors: u32,
    pub max_discard_sectors: u32,
}

/// The header, the basic part (32 bytes) and the discard part (20 bytes).
pub const PARAMS_BYTES: u16 = 60;

impl Params {
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&u32::from(PARAMS_BYTES).to_ne_bytes());
        b[4..8].copy_from_slice(&(PARAM_TYPE_BASIC | PARAM_TYPE_DISCARD).to_ne_bytes());
        // basic, at 8: the engine has a volatile cache (writes are durable at FLUSH or with
        // FUA), and 4 KiB blocks, as the volumes' replicas.
        b[8..12].copy_from_slice(&(ATTR_VOLATILE_CACHE | ATTR_FUA).to_ne_bytes());
        b[12] = 12; // logical_bs_shift
        b[13] = 12; // physical_bs_shift
        b[14] = 12; // io_opt_shift
        b[15] = 12; // io_min_shift
        b[16..20].copy_from_slice(&self.max_sectors.to_ne_bytes());
        // chunk_sectors (20..24) and virt_boundary_mask (32..40) stay 0.
        b[24..32].copy_from_slice(&self.dev_sectors.to_ne_bytes());
        // discard, at 40
        b[44..48].copy_from_slice(&4096u32.to_ne_bytes()); // granularity
        b[48..52].copy_from_slice(&self.max_discard_sectors.to_ne_bytes());
        b[52..56].copy_from_slice(&self.max_discard_sectors.to_ne_bytes()); // write zeroes
        b[56..58].copy_from_slice(&1u16.to_ne_bytes()); // max_discard_segments
        b
    }
}

/// `struct ublksrv_io_cmd`: the 16 bytes of a FETCH or COMMIT_AND_FETCH.
pub fn io_cmd(q_id: u16, tag: u16, result: i32, addr: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..2].copy_from_slice(&q_id.to_ne_bytes());
    b[2..4].copy_from_slice(&tag.to_ne_bytes());
    b[4..8].copy_from_slice(&result.to_ne_bytes());
    b[8..16].copy_from_slice(&addr.to_ne_bytes());
    b
}

/// `struct ublksrv_io_desc`: what the kernel asks of one tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoDesc {
    pub op_flags: u32,
    pub nr_sectors: u32,
    pub start_sector: u64,
}

impl IoDesc {
    pub fn decode(b: &[u8]) -> IoDesc {
        IoDesc {
            op_flags: u32_at(b, 0),
            nr_sectors: u32_at(b, 4),
            start_sector: u64_at(b, 8),
        }
    }
    pub fn op(&self) -> u8 {
        (self.op_flags & 0xff) as u8
    }
    pub fn flags(&self) -> u32 {
        self.op_flags & !0xff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_numbers_match_the_kernel_header() {
        // The values of UBLK_U_CMD_ADD_DEV and UBLK_U_IO_FETCH_REQ in ublk_cmd.h.
        assert_eq!(CMD_ADD_DEV, 0xc020_7504);
        assert_eq!(CMD_GET_DEV_INFO, 0xc020_7502);
        assert_eq!(IO_FETCH_REQ, 0xc010_7520);
        assert_eq!(IO_COMMIT_AND_FETCH_REQ, 0xc010_7521);
    }

    #[test]
    fn dev_info_round_trips_and_short_input_is_zero() {
        let info = DevInfo {
            nr_hw_queues: 2,
            queue_depth: 64,
            state: S_DEV_QUIESCED,
            max_io_buf_bytes: 1 << 18,
            dev_id: 7,
            ublksrv_pid: -1,
            flags: F_USER_RECOVERY | F_USER_RECOVERY_REISSUE,
            ublksrv_flags: 0xdead_beef_0000_0001,
        };
        assert_eq!(DevInfo::decode(&info.encode()), info);
        for cut in 0..DEV_INFO_BYTES {
            let d = DevInfo::decode(&info.encode()[..cut]);
            assert!(d.ublksrv_flags == 0 || cut >= 40, "cut {cut}");
        }
        assert_eq!(DevInfo::decode(&[]), DevInfo::default());
    }

    #[test]
    fn io_desc_splits_op_and_flags() {
        let mut b = [0u8; IO_DESC_BYTES];
        b[0..4].copy_from_slice(&(u32::from(OP_WRITE) | IO_F_FUA).to_ne_bytes());
        b[4..8].copy_from_slice(&8u32.to_ne_bytes());
        b[8..16].copy_from_slice(&16u64.to_ne_bytes());
        let d = IoDesc::decode(&b);
        assert_eq!(
            (d.op(), d.flags(), d.nr_sectors, d.start_sector),
            (OP_WRITE, IO_F_FUA, 8, 16)
        );
        assert_eq!(IoDesc::decode(&b[..3]).op_flags, 0);
    }
}
