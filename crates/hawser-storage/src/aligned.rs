//! Page-aligned byte buffers. Replica data files are opened with O_DIRECT, which needs buffers
//! aligned to the device's logical block size; allocating every payload page-aligned once, when
//! it is read off a socket, lets it go to disk without another copy.
//!
//! Buffers are recycled (see [`AlignedBuf::for_overwrite`]). A fresh 1 MiB allocation is an
//! mmap, 256 page faults that each zero a page, a memset, and an munmap with a TLB shootdown
//! when it is freed: measured on a resync (1 MiB frames), that was the largest CPU cost of the
//! receiving replica server, more than the socket copy and the checksum together. A fresh 4 KiB
//! one is a page-aligned malloc (glibc's slow memalign path) and a memset: 14% of the
//! instructions an agent ran per 4k write (`make instructions`), more than the engine.
//!
//! The unsafe code here (raw allocation, the free list, slices over owned memory) is run
//! under Miri by `make miri`.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;

use bytes::Bytes;

/// Alignment of every buffer: a page, which satisfies any logical block size up to 4096.
pub const ALIGN: usize = 4096;

/// Buffers at least this large count against `RECYCLE_MAX_BYTES`; smaller ones against
/// `SMALL_RECYCLE_MAX_BYTES`, so a burst of large frames cannot crowd out the 4 KiB buffers
/// every small request needs, nor the reverse.
pub const RECYCLE_MIN_BYTES: usize = 64 * 1024;

/// Most bytes of large buffers the free list keeps; beyond this, dropped buffers are freed.
pub const RECYCLE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Most bytes of small buffers the free list keeps: 1,024 of 4 KiB, more than the requests
/// a few deep queues keep in flight.
pub const SMALL_RECYCLE_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Dropped buffers waiting for reuse, by allocation size (a size's buffers are used last in,
/// first out, so the most recently touched memory goes first).
struct FreeList {
    bufs: BTreeMap<usize, Vec<NonNull<u8>>>,
    large_bytes: usize,
    small_bytes: usize,
}

// SAFETY: the list owns the allocations it holds exclusively (nothing else points to them).
unsafe impl Send for FreeList {}

static FREE: Mutex<FreeList> = Mutex::new(FreeList {
    bufs: BTreeMap::new(),
    large_bytes: 0,
    small_bytes: 0,
});

impl FreeList {
    fn bytes_of(&mut self, size: usize) -> &mut usize {
        if size < RECYCLE_MIN_BYTES {
            &mut self.small_bytes
        } else {
            &mut self.large_bytes
        }
    }
}

/// A recycled allocation of exactly `size` bytes, if one is free.
fn take_free(size: usize) -> Option<NonNull<u8>> {
    let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
    let ptr = free.bufs.get_mut(&size)?.pop()?;
    *free.bytes_of(size) -= size;
    Some(ptr)
}

/// Keep an allocation of `size` bytes for reuse; false if the list is full (free it then).
fn give_free(size: usize, ptr: NonNull<u8>) -> bool {
    let cap = if size < RECYCLE_MIN_BYTES {
        SMALL_RECYCLE_MAX_BYTES
    } else {
        RECYCLE_MAX_BYTES
    };
    let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
    let bytes = free.bytes_of(size);
    if *bytes + size > cap {
        return false;
    }
    *bytes += size;
    free.bufs.entry(size).or_default().push(ptr);
    true
}

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

    /// A buffer of `len` bytes whose contents are unspecified (zeroes, or what an earlier
    /// buffer held): for callers that overwrite all of it before reading any (a socket read or
    /// a disk read of exactly `len` bytes) and drop it on failure. It comes from the free list
    /// when it can, which saves the allocation and zeroing of a fresh one.
    pub fn for_overwrite(len: usize) -> AlignedBuf {
        let size = Self::layout(len).size();
        match take_free(size) {
            Some(ptr) => AlignedBuf { ptr, len },
            None => AlignedBuf::zeroed(len),
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn copy_from(data: &[u8]) -> AlignedBuf {
        let mut b = AlignedBuf::for_overwrite(data.len());
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
        let layout = Self::layout(self.len);
        if give_free(layout.size(), self.ptr) {
            return;
        }
        // SAFETY: allocated in `zeroed` with exactly this layout (a recycled allocation keeps
        // its size, and `for_overwrite` only reuses one of the same size).
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
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

    /// A buffer of `len` bytes (a size no other test uses) is dropped, and the next one of
    /// that size must be the same allocation; returns the second one.
    fn reused_after_drop(len: usize) -> AlignedBuf {
        let mut a = AlignedBuf::for_overwrite(len);
        a.as_mut_slice().fill(9);
        let ptr = a.as_slice().as_ptr();
        drop(a);
        let b = AlignedBuf::for_overwrite(len);
        assert_eq!(
            b.as_slice().as_ptr(),
            ptr,
            "the dropped allocation was not reused"
        );
        b
    }

    #[test]
    fn large_buffers_are_recycled_with_their_size() {
        let len = RECYCLE_MIN_BYTES * 3 + 100;
        let b = reused_after_drop(len);
        let ptr = b.as_slice().as_ptr();
        assert_eq!(b.len(), len);
        assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
        // A different size never gets it.
        drop(b);
        let c = AlignedBuf::for_overwrite(len + ALIGN);
        assert_ne!(c.as_slice().as_ptr(), ptr);
        assert!(
            c.as_slice().iter().all(|&x| x == 0),
            "a fresh buffer is zeroed"
        );
    }

    #[test]
    fn small_buffers_are_recycled_too_up_to_their_own_cap() {
        let len = 3 * ALIGN + 1; // 4 pages
        drop(reused_after_drop(len));
        // However many are dropped at once, the list keeps no more than its cap.
        let n = SMALL_RECYCLE_MAX_BYTES / (4 * ALIGN) + 1;
        let many: Vec<AlignedBuf> = (0..n).map(|_| AlignedBuf::for_overwrite(len)).collect();
        drop(many);
        let free = FREE.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            free.small_bytes <= SMALL_RECYCLE_MAX_BYTES,
            "{}",
            free.small_bytes
        );
        assert!(free.large_bytes <= RECYCLE_MAX_BYTES);
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
