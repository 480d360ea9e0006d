//! `/dev/ublk-control`: adding, starting, recovering, stopping and deleting devices. Each
//! command is one io_uring passthrough (`URING_CMD` with 128-byte SQEs) and is synchronous;
//! callers run them on blocking threads (`START_DEV` and `END_USER_RECOVERY` wait until every
//! queue of the device has fetched its requests).

use std::fs::File;
use std::os::fd::AsRawFd;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::abi::{self, CtrlCmd, DevInfo, Params};

pub const CONTROL_PATH: &str = "/dev/ublk-control";

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("open {CONTROL_PATH}: {0}")]
    Open(std::io::Error),
    #[error("io_uring for ublk control: {0}")]
    Ring(std::io::Error),
    #[error("ublk {what} of device {dev_id}: {source}")]
    Command {
        what: &'static str,
        dev_id: u32,
        source: std::io::Error,
    },
}

impl ControlError {
    /// The errno the kernel answered a command with.
    pub fn errno(&self) -> Option<i32> {
        match self {
            ControlError::Command { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

pub struct Control {
    file: File,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
}

impl Control {
    pub fn open() -> Result<Control, ControlError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(CONTROL_PATH)
            .map_err(ControlError::Open)?;
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build(4)
            .map_err(ControlError::Ring)?;
        Ok(Control { file, ring })
    }

    /// Send `cmd` (`op`, named `what` in errors) and wait for its answer.
    fn call(&mut self, what: &'static str, op: u32, cmd: CtrlCmd) -> Result<i32, ControlError> {
        let err = |source| ControlError::Command {
            what,
            dev_id: cmd.dev_id,
            source,
        };
        let sqe = opcode::UringCmd80::new(types::Fd(self.file.as_raw_fd()), op)
            .cmd(cmd.encode())
            .build();
        // SAFETY: the buffer `cmd.addr` names (if any) is owned by the caller and outlives
        // this call, which waits for the command's completion before returning.
        unsafe { self.ring.submission().push(&sqe) }
            .map_err(|_| err(std::io::Error::other("control ring full")))?;
        self.ring.submit_and_wait(1).map_err(err)?;
        let cqe = self
            .ring
            .completion()
            .next()
            .ok_or_else(|| err(std::io::Error::other("no completion")))?;
        match cqe.result() {
            r if r < 0 => Err(err(std::io::Error::from_raw_os_error(-r))),
            r => Ok(r),
        }
    }

    /// Features this kernel's ublk has (`UBLK_F_*`); 0 before Linux 6.5, which cannot say.
    pub fn features(&mut self) -> u64 {
        let mut out = [0u8; 8];
        let cmd = CtrlCmd {
            len: 8,
            addr: out.as_mut_ptr() as u64,
            ..CtrlCmd::for_device(u32::MAX)
        };
        match self.call("GET_FEATURES", abi::CMD_GET_FEATURES, cmd) {
            Ok(_) => u64::from_ne_bytes(out),
            Err(_) => 0,
        }
    }

    /// Add a device (the kernel picks its number); returns what the kernel made of `info`.
    pub fn add(&mut self, info: &DevInfo) -> Result<DevInfo, ControlError> {
        let mut buf = info.encode();
        let cmd = CtrlCmd {
            len: abi::DEV_INFO_LEN,
            addr: buf.as_mut_ptr() as u64,
            ..CtrlCmd::for_device(info.dev_id)
        };
        self.call("ADD_DEV", abi::CMD_ADD_DEV, cmd)?;
        Ok(DevInfo::decode(&buf))
    }

    pub fn info(&mut self, dev_id: u32) -> Result<DevInfo, ControlError> {
        let mut buf = [0u8; abi::DEV_INFO_BYTES];
        let cmd = CtrlCmd {
            len: abi::DEV_INFO_LEN,
            addr: buf.as_mut_ptr() as u64,
            ..CtrlCmd::for_device(dev_id)
        };
        self.call("GET_DEV_INFO", abi::CMD_GET_DEV_INFO, cmd)?;
        Ok(DevInfo::decode(&buf))
    }

    pub fn set_params(&mut self, dev_id: u32, params: &Params) -> Result<(), ControlError> {
        let buf = params.encode();
        let cmd = CtrlCmd {
            len: abi::PARAMS_BYTES,
            addr: buf.as_ptr() as u64,
            ..CtrlCmd::for_device(dev_id)
        };
        self.call("SET_PARAMS", abi::CMD_SET_PARAMS, cmd).map(drop)
    }

    /// Make `/dev/ublkb<dev_id>` appear; waits until every queue fetched its requests.
    pub fn start(&mut self, dev_id: u32) -> Result<(), ControlError> {
        let cmd = CtrlCmd {
            data: u64::from(std::process::id()),
            ..CtrlCmd::for_device(dev_id)
        };
        self.call("START_DEV", abi::CMD_START_DEV, cmd).map(drop)
    }

    /// Begin taking back a device whose server died (`EBUSY` until the dead server's files
    /// are closed and the device is quiesced).
    pub fn start_recovery(&mut self, dev_id: u32) -> Result<(), ControlError> {
        let cmd = CtrlCmd::for_device(dev_id);
        self.call("START_USER_RECOVERY", abi::CMD_START_USER_RECOVERY, cmd)
            .map(drop)
    }

    /// End a recovery: waits until every queue fetched, then lets the held I/O through.
    pub fn end_recovery(&mut self, dev_id: u32) -> Result<(), ControlError> {
        let cmd = CtrlCmd {
            data: u64::from(std::process::id()),
            ..CtrlCmd::for_device(dev_id)
        };
        self.call("END_USER_RECOVERY", abi::CMD_END_USER_RECOVERY, cmd)
            .map(drop)
    }

    /// Set the device's size to `sectors` of 512 bytes (`UBLK_F_UPDATE_SIZE`, Linux 6.16).
    pub fn update_size(&mut self, dev_id: u32, sectors: u64) -> Result<(), ControlError> {
        let cmd = CtrlCmd {
            data: sectors,
            ..CtrlCmd::for_device(dev_id)
        };
        self.call("UPDATE_SIZE", abi::CMD_UPDATE_SIZE, cmd)
            .map(drop)
    }

    /// Remove the block device; I/O held or queued on it fails.
    pub fn stop(&mut self, dev_id: u32) -> Result<(), ControlError> {
        self.call("STOP_DEV", abi::CMD_STOP_DEV, CtrlCmd::for_device(dev_id))
            .map(drop)
    }

    /// Free the device number. The asynchronous form does not wait for whoever still holds
    /// the block device open (a mounted filesystem); older kernels only have the waiting one.
    pub fn delete(&mut self, dev_id: u32) -> Result<(), ControlError> {
        match self.call(
            "DEL_DEV",
            abi::CMD_DEL_DEV_ASYNC,
            CtrlCmd::for_device(dev_id),
        ) {
            Err(e) if e.errno() == Some(libc::EOPNOTSUPP) || e.errno() == Some(libc::EINVAL) => {
                self.call("DEL_DEV", abi::CMD_DEL_DEV, CtrlCmd::for_device(dev_id))
                    .map(drop)
            }
            other => other.map(drop),
        }
    }
}
