//! One ublk request: what the kernel's descriptor asks ([`decode`], checked against the
//! volume), and running it on the block device with the tag's buffer ([`run`]).

use hawser_core::IoError;
use hawser_storage::AlignedBuf;

use super::abi::{self, IoDesc};
use crate::frontends::block::{execute, BlockDevice, Op};

/// The request in `d`, or the negative errno to answer it with: an unknown operation, or a
/// range that is misaligned, outside a volume of `size` bytes, or longer than the tag's
/// buffer (`max_bytes`, for reads and writes). The kernel checks ranges itself; this is the
/// second check the block seam asks for, and what keeps a wrong descriptor off the volume.
pub fn decode(d: &IoDesc, size: u64, max_bytes: u32) -> Result<Op, i32> {
    // A flush has no range (the kernel sends sector -1).
    if d.op() == abi::OP_FLUSH {
        return Ok(Op::Flush);
    }
    let offset = d.start_sector.checked_mul(512).ok_or(-libc::EINVAL)?;
    let len = d.nr_sectors.checked_mul(512).ok_or(-libc::EINVAL)?;
    let fua = d.flags() & abi::IO_F_FUA != 0;
    let ranged = |data: bool| -> Result<(), i32> {
        let end = offset.checked_add(u64::from(len)).ok_or(-libc::EINVAL)?;
        let aligned = offset % 4096 == 0 && len % 4096 == 0;
        if !aligned || len == 0 || end > size || (data && len > max_bytes) {
            return Err(-libc::EINVAL);
        }
        Ok(())
    };
    match d.op() {
        abi::OP_READ => ranged(true).map(|()| Op::Read { offset, len }),
        abi::OP_WRITE => ranged(true).map(|()| Op::Write { offset, len, fua }),
        abi::OP_DISCARD => ranged(false).map(|()| Op::Trim { offset, len, fua }),
        abi::OP_WRITE_ZEROES => ranged(false).map(|()| Op::WriteZeroes {
            offset,
            len,
            fua,
            may_trim: d.flags() & abi::IO_F_NOUNMAP == 0,
        }),
        _ => Err(-libc::EOPNOTSUPP),
    }
}

fn errno(e: IoError) -> i32 {
    match e {
        IoError::Invalid => -libc::EINVAL,
        IoError::NoSpace => -libc::ENOSPC,
        // A fenced engine: the volume moved on; the kernel turns this into an I/O error.
        IoError::Io | IoError::ShutDown => -libc::EIO,
    }
}

/// Run `op` on `dev`; `buf` is the tag's buffer (the kernel filled it for a write, and copies
/// a read out of it). Returns what the commit carries: bytes done, or a negative errno.
pub async fn run(dev: &dyn BlockDevice, op: Op, buf: &mut [u8]) -> i32 {
    let payload = match op {
        // The replicas write with O_DIRECT: hand them an aligned copy.
        Op::Write { len, .. } => AlignedBuf::copy_from(&buf[..len as usize]).into_bytes(),
        _ => bytes::Bytes::new(),
    };
    match execute(dev, op, payload).await {
        Ok(Some(data)) => {
            buf[..data.len()].copy_from_slice(&data);
            i32::try_from(data.len()).unwrap_or(-libc::EINVAL)
        }
        Ok(None) => match op {
            Op::Write { len, .. } => i32::try_from(len).unwrap_or(-libc::EINVAL),
            _ => 0,
        },
        Err(e) => errno(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(op: u8, flags: u32, start_sector: u64, nr_sectors: u32) -> IoDesc {
        IoDesc {
            op_flags: u32::from(op) | flags,
            nr_sectors,
            start_sector,
        }
    }

    const SIZE: u64 = 1 << 20;
    const MAX: u32 = 1 << 17;

    #[test]
    fn decodes_each_operation() {
        assert_eq!(
            decode(&desc(abi::OP_READ, 0, 8, 8), SIZE, MAX),
            Ok(Op::Read {
                offset: 4096,
                len: 4096
            })
        );
        assert_eq!(
            decode(&desc(abi::OP_WRITE, abi::IO_F_FUA, 0, 16), SIZE, MAX),
            Ok(Op::Write {
                offset: 0,
                len: 8192,
                fua: true
            })
        );
        assert_eq!(
            decode(&desc(abi::OP_FLUSH, 0, 0, 0), SIZE, MAX),
            Ok(Op::Flush)
        );
        assert_eq!(
            decode(
                &desc(abi::OP_WRITE_ZEROES, abi::IO_F_NOUNMAP, 0, 2048),
                SIZE,
                MAX
            ),
            Ok(Op::WriteZeroes {
                offset: 0,
                len: 1 << 20,
                fua: false,
                may_trim: false
            })
        );
        // Discard and zeroes may be longer than a buffer: they carry no data.
        assert_eq!(
            decode(&desc(abi::OP_DISCARD, 0, 0, 2048), SIZE, MAX),
            Ok(Op::Trim {
                offset: 0,
                len: 1 << 20,
                fua: false
            })
        );
    }

    #[test]
    fn refuses_bad_ranges_and_unknown_operations() {
        let einval = Err(-libc::EINVAL);
        // Past the end, straddling the end, misaligned, empty, larger than the buffer.
        assert_eq!(
            decode(&desc(abi::OP_READ, 0, SIZE / 512, 8), SIZE, MAX),
            einval
        );
        assert_eq!(
            decode(&desc(abi::OP_WRITE, 0, SIZE / 512 - 8, 16), SIZE, MAX),
            einval
        );
        assert_eq!(decode(&desc(abi::OP_READ, 0, 1, 8), SIZE, MAX), einval);
        assert_eq!(decode(&desc(abi::OP_READ, 0, 0, 1), SIZE, MAX), einval);
        assert_eq!(decode(&desc(abi::OP_READ, 0, 0, 0), SIZE, MAX), einval);
        assert_eq!(decode(&desc(abi::OP_WRITE, 0, 0, 512), SIZE, MAX), einval);
        // Overflow of the sector arithmetic.
        assert_eq!(
            decode(&desc(abi::OP_READ, 0, u64::MAX, 8), SIZE, MAX),
            einval
        );
        assert_eq!(
            decode(&desc(abi::OP_DISCARD, 0, 8, u32::MAX), SIZE, MAX),
            einval
        );
        // WRITE_SAME (4), zone operations and anything else.
        for op in [4u8, 10, 0xff] {
            assert_eq!(
                decode(&desc(op, 0, 0, 8), SIZE, MAX),
                Err(-libc::EOPNOTSUPP)
            );
        }
    }
}
