//! One NBD transmission request as the device sees it: validation of a header against the
//! export (`check_request`, which turns it into an [`Op`] or the errno to reply with) and its
//! execution on a [`BlockDevice`].
//!
//! A data request of length 0 is refused with EINVAL: the spec leaves it unspecified, no real
//! client sends it, and refusing it keeps every request the device sees non-empty.

use hawser_wire::constants::{MAX_PAYLOAD_BYTES, SECTOR_BYTES};
use hawser_wire::nbd::{self, Command, Request};

pub use crate::frontends::block::{execute, Op};

/// Validate a request against an export of `size` bytes; `Err` is the errno to reply with.
///
/// FUA is accepted on every command (the spec requires it once SEND_FUA is advertised);
/// NO_HOLE only on WRITE_ZEROES; any other flag is EINVAL. Writes past the end get ENOSPC
/// and other out-of-range requests EINVAL, as the spec recommends. FLUSH ignores its offset
/// and length, which the spec reserves.
pub fn check_request(req: &Request, size: u64) -> Result<Op, u32> {
    let allowed = match req.command {
        Command::WriteZeroes => nbd::CMD_FLAG_FUA | nbd::CMD_FLAG_NO_HOLE,
        Command::Read | Command::Write | Command::Flush | Command::Trim => nbd::CMD_FLAG_FUA,
        // DISC never reaches here; unknown commands carry no payload we could know about.
        Command::Disc | Command::Unknown(_) => return Err(nbd::EINVAL),
    };
    if req.flags & !allowed != 0 {
        return Err(nbd::EINVAL);
    }
    let fua = req.flags & nbd::CMD_FLAG_FUA != 0;
    let (offset, len) = (req.offset, req.length);
    match req.command {
        Command::Read => {
            if len > MAX_PAYLOAD_BYTES {
                return Err(nbd::EOVERFLOW);
            }
            check_range(offset, len, size, nbd::EINVAL)?;
            Ok(Op::Read { offset, len })
        }
        Command::Write => {
            check_range(offset, len, size, nbd::ENOSPC)?;
            Ok(Op::Write { offset, len, fua })
        }
        Command::Trim => {
            check_range(offset, len, size, nbd::EINVAL)?;
            Ok(Op::Trim { offset, len, fua })
        }
        Command::WriteZeroes => {
            check_range(offset, len, size, nbd::ENOSPC)?;
            let may_trim = req.flags & nbd::CMD_FLAG_NO_HOLE == 0;
            Ok(Op::WriteZeroes {
                offset,
                len,
                fua,
                may_trim,
            })
        }
        _ => Ok(Op::Flush),
    }
}

fn check_range(offset: u64, len: u32, size: u64, beyond_end: u32) -> Result<(), u32> {
    let len = u64::from(len);
    if len == 0 || !offset.is_multiple_of(SECTOR_BYTES) || !len.is_multiple_of(SECTOR_BYTES) {
        return Err(nbd::EINVAL);
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(beyond_end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: u64 = 1 << 20;

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            handle: 9,
            offset,
            length,
        }
    }

    #[test]
    fn valid_requests_become_ops() {
        let r = check_request(&req(Command::Read, 0, 512, 4096), SIZE);
        assert_eq!(
            r,
            Ok(Op::Read {
                offset: 512,
                len: 4096
            })
        );
        let w = check_request(&req(Command::Write, nbd::CMD_FLAG_FUA, 0, 512), SIZE);
        assert_eq!(
            w,
            Ok(Op::Write {
                offset: 0,
                len: 512,
                fua: true
            })
        );
        let z = check_request(
            &req(Command::WriteZeroes, nbd::CMD_FLAG_NO_HOLE, 0, 512),
            SIZE,
        );
        assert_eq!(
            z,
            Ok(Op::WriteZeroes {
                offset: 0,
                len: 512,
                fua: false,
                may_trim: false
            })
        );
        let t = check_request(
            &req(Command::Trim, nbd::CMD_FLAG_FUA, SIZE - 512, 512),
            SIZE,
        );
        assert_eq!(
            t,
            Ok(Op::Trim {
                offset: SIZE - 512,
                len: 512,
                fua: true
            })
        );
        // FLUSH ignores its reserved fields.
        assert_eq!(
            check_request(&req(Command::Flush, 0, 3, 7), SIZE),
            Ok(Op::Flush)
        );
    }

    #[test]
    fn bad_requests_get_the_right_errno() {
        let cases = [
            (req(Command::Read, 0, 1, 512), nbd::EINVAL),
            (req(Command::Read, 0, 0, 511), nbd::EINVAL),
            (req(Command::Read, 0, 0, 0), nbd::EINVAL),
            (req(Command::Read, 0, SIZE, 512), nbd::EINVAL),
            (req(Command::Read, 0, u64::MAX - 511, 1024), nbd::EINVAL),
            (
                req(Command::Read, 0, 0, MAX_PAYLOAD_BYTES + 512),
                nbd::EOVERFLOW,
            ),
            (
                req(Command::Read, nbd::CMD_FLAG_NO_HOLE, 0, 512),
                nbd::EINVAL,
            ),
            (req(Command::Read, nbd::CMD_FLAG_DF, 0, 512), nbd::EINVAL),
            (req(Command::Write, 0, SIZE - 512, 1024), nbd::ENOSPC),
            (req(Command::Write, 0, 0, 0), nbd::EINVAL),
            (req(Command::WriteZeroes, 0, SIZE, 512), nbd::ENOSPC),
            (
                req(Command::WriteZeroes, nbd::CMD_FLAG_FAST_ZERO, 0, 512),
                nbd::EINVAL,
            ),
            (req(Command::Trim, 0, SIZE, 512), nbd::EINVAL),
            (req(Command::Flush, 1 << 15, 0, 0), nbd::EINVAL),
            (req(Command::Unknown(5), 0, 0, 512), nbd::EINVAL),
            (req(Command::Unknown(0xffff), 0, 0, 0), nbd::EINVAL),
        ];
        for (r, want) in cases {
            assert_eq!(check_request(&r, SIZE), Err(want), "{r:?}");
        }
    }
}
