//! The one place that turns the outcome of a block request into an NBD error value.

use hawser_core::IoError;
use hawser_wire::nbd;

/// The NBD error value a client sees for `err`.
pub fn errno(err: IoError) -> u32 {
    match err {
        IoError::Invalid => nbd::EINVAL,
        IoError::NoSpace => nbd::ENOSPC,
        IoError::Io => nbd::EIO,
        // Clients react to ESHUTDOWN with a soft disconnect, which is what a fenced or
        // stopping engine wants: the client reconnects to whichever node now owns the volume.
        IoError::ShutDown => nbd::ESHUTDOWN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_distinct_nonzero_errno() {
        let all = [
            IoError::Invalid,
            IoError::NoSpace,
            IoError::Io,
            IoError::ShutDown,
        ];
        let codes: Vec<u32> = all.iter().map(|&e| errno(e)).collect();
        assert_eq!(codes, vec![22, 28, 5, 108]);
    }
}
