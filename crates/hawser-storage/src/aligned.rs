//! Page-aligned byte buffers. Replica data files are opened with O_DIRECT, which needs buffers
//! aligned to the device's logical block size; allocating every payload page-aligned once, when
//! it is read off a socket, lets it go to disk without another copy.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use bytes::Bytes;

/// Alignment of every buffer: a page, which satisfies any logical block size up to 4096.
pub const ALIGN: usize = 4096;

/// A zero-initialised, 4096-aligned heap buffer of a fixed length.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reads of the owned bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes. A zero-length buffer allocates one page so the pointer
    /// is always valid and aligned.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size (at least ALIGN) and a power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len }
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_from(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    fn layout(len: usize) -> Layout {
        let size = len.max(1).div_ceil(ALIGN) * ALIGN;
        match Layout::from_size_align(size, ALIGN) {
            Ok(l) => l,
            // Only reachable for lengths near usize::MAX, which no bounded caller passes.
            Err(_) => panic!("aligned buffer of {len} bytes is not allocatable"),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for `len` initialised bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for `len` bytes and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Freeze into a cheaply clonable `Bytes` that keeps the alignment.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

/// Whether `data` can be handed to an O_DIRECT write as is.
pub fn is_aligned(data: &[u8]) -> bool {
    (data.as_ptr() as usize).is_multiple_of(512) && data.len().is_multiple_of(512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0, 1, 512, 4096, 4097, 1 << 20] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
    }

    #[test]
    fn bytes_keep_alignment_and_content() {
        let b = AlignedBuf::copy_from(&[7u8; 8192]).into_bytes();
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.iter().all(|&x| x == 7));
        let half = b.slice(4096..);
        assert!(is_aligned(&half));
    }
}
