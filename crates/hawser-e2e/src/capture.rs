//! A packet capture on the loopback interface, as tcpdump would take it: an `AF_PACKET` raw
//! socket bound to `lo` (root only) whose every frame, both directions, is kept until the
//! capture stops. Tests search it for bytes that must not travel in the clear.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Captures at most this many bytes; a test writes far less.
const LIMIT: usize = 512 << 20;

pub struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<std::io::Result<Vec<u8>>>>,
}

impl Capture {
    /// Starts capturing every frame on `lo`.
    pub fn loopback() -> std::io::Result<Capture> {
        let fd = open_on("lo")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut frame = vec![0u8; 256 << 10];
            let result = loop {
                if stopping.load(Ordering::Acquire) {
                    break Ok(());
                }
                // SAFETY: `frame` is a live buffer of the given length and fd is ours.
                let n = unsafe { libc::recv(fd, frame.as_mut_ptr().cast(), frame.len(), 0) };
                if n < 0 {
                    let e = std::io::Error::last_os_error();
                    match e.kind() {
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => {
                            continue
                        }
                        _ => break Err(e),
                    }
                }
                let n = usize::try_from(n).unwrap_or(0);
                if all.len() + n <= LIMIT {
                    all.extend_from_slice(&frame[..n]);
                }
            };
            // SAFETY: fd is ours and closed once.
            unsafe { libc::close(fd) };
            result.map(|()| all)
        });
        Ok(Capture {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops and returns the captured frames, concatenated.
    pub fn finish(mut self) -> std::io::Result<Vec<u8>> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => Err(std::io::Error::other("the capture thread panicked")),
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A raw packet socket bound to interface `name`, with a 100 ms receive timeout (so the
/// thread sees a stop) and a large buffer (so a burst is not dropped).
fn open_on(name: &str) -> std::io::Result<libc::c_int> {
    let all = u16::try_from(libc::ETH_P_ALL).unwrap_or(3).to_be();
    // SAFETY: plain socket call.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, libc::c_int::from(all)) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fail = |fd| {
        let e = std::io::Error::last_os_error();
        // SAFETY: fd is ours.
        unsafe { libc::close(fd) };
        Err(e)
    };
    let cname = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return fail(fd);
    }
    // SAFETY: zeroed sockaddr_ll is valid; the fields set are its documented ones.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(17);
    addr.sll_protocol = all;
    addr.sll_ifindex = i32::try_from(index).unwrap_or(0);
    let len = u32::try_from(std::mem::size_of::<libc::sockaddr_ll>()).unwrap_or(20);
    // SAFETY: addr is a sockaddr_ll of `len` bytes.
    if unsafe { libc::bind(fd, std::ptr::addr_of!(addr).cast(), len) } != 0 {
        return fail(fd);
    }
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    let buffer: libc::c_int = 64 << 20;
    let set = |opt, value: *const libc::c_void, len: usize| {
        let len = u32::try_from(len).unwrap_or(0);
        // SAFETY: value points to `len` readable bytes.
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, opt, value, len) }
    };
    if set(
        libc::SO_RCVTIMEO,
        std::ptr::addr_of!(timeout).cast(),
        std::mem::size_of::<libc::timeval>(),
    ) != 0
        || set(
            libc::SO_RCVBUFFORCE,
            std::ptr::addr_of!(buffer).cast(),
            std::mem::size_of::<libc::c_int>(),
        ) != 0
    {
        return fail(fd);
    }
    Ok(fd)
}
