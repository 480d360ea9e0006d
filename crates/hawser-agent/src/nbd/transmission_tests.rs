//! The connection task against a memory device and in-memory sockets: requests and replies
//! split at every byte, a device that returns short reads, a client that stops reading its
//! replies, a client that hangs up with requests in flight, and replies that finish together.
//!
//! Time is paused: `settle` returns once every task is blocked (tokio advances the clock
//! only when nothing can run), which is how these tests know the server has done all it will.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hawser_core::IoError;
use hawser_wire::nbd::{self, Command, Request, SimpleReply};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::sync::{watch, Semaphore};

use super::*;

const SIZE: u64 = 1 << 20;

/// A device in memory. With a gate, every request waits for a permit before it runs.
#[derive(Default)]
struct MemDevice {
    data: Mutex<Vec<u8>>,
    gate: Option<Arc<Semaphore>>,
    /// Reads at this offset return one sector less than asked.
    short_at: Option<u64>,
    started: AtomicUsize,
    finished: AtomicUsize,
    /// Requests whose future was dropped before it finished.
    abandoned: Arc<AtomicUsize>,
    /// Per request started, whether the frontend said it was alone in its queue.
    alone: Mutex<Vec<bool>>,
}

impl MemDevice {
    fn new() -> MemDevice {
        MemDevice {
            data: Mutex::new(vec![0; SIZE as usize]),
            ..MemDevice::default()
        }
    }

    fn gated(gate: &Arc<Semaphore>) -> MemDevice {
        MemDevice {
            gate: Some(Arc::clone(gate)),
            ..MemDevice::new()
        }
    }

    async fn enter(&self) -> Finishing {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.alone
            .lock()
            .unwrap()
            .push(crate::frontends::block::request_is_alone());
        let guard = Finishing {
            abandoned: Arc::clone(&self.abandoned),
            done: false,
        };
        if let Some(gate) = &self.gate {
            gate.acquire().await.expect("gate open").forget();
        }
        guard
    }

    fn leave(&self, mut guard: Finishing) {
        guard.done = true;
        self.finished.fetch_add(1, Ordering::SeqCst);
    }
}

/// Counts a request abandoned if dropped before `leave`.
struct Finishing {
    abandoned: Arc<AtomicUsize>,
    done: bool,
}

impl Drop for Finishing {
    fn drop(&mut self) {
        if !self.done {
            self.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        SIZE
    }
    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        let guard = self.enter().await;
        let mut len = len as usize;
        if self.short_at == Some(offset) {
            len -= 512;
        }
        let start = offset as usize;
        let out = Bytes::copy_from_slice(&self.data.lock().unwrap()[start..start + len]);
        self.leave(guard);
        Ok(out)
    }
    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<(), IoError> {
        let guard = self.enter().await;
        let start = offset as usize;
        self.data.lock().unwrap()[start..start + data.len()].copy_from_slice(&data);
        self.leave(guard);
        Ok(())
    }
    async fn flush(&self) -> Result<(), IoError> {
        let guard = self.enter().await;
        self.leave(guard);
        Ok(())
    }
    async fn trim(&self, offset: u64, len: u32) -> Result<(), IoError> {
        self.write_zeroes(offset, len, false, true).await
    }
    async fn write_zeroes(&self, offset: u64, len: u32, _: bool, _: bool) -> Result<(), IoError> {
        let guard = self.enter().await;
        let start = offset as usize;
        self.data.lock().unwrap()[start..start + len as usize].fill(0);
        self.leave(guard);
        Ok(())
    }
}

/// A socket end that moves at most `step` bytes per read or write, and answers every other
/// poll with `Pending` (waking itself), so every partial-progress path of the server runs.
struct Trickle {
    inner: DuplexStream,
    step: usize,
    /// Whether the last read (write) poll stalled; read and write alternate on their own.
    stall: [bool; 2],
    writes: Arc<AtomicUsize>,
}

impl Trickle {
    fn stalls(&mut self, cx: &mut Context<'_>, side: usize) -> bool {
        self.stall[side] = !self.stall[side];
        if self.stall[side] {
            cx.waker().wake_by_ref();
        }
        self.stall[side]
    }
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.stalls(cx, 0) {
            return Poll::Pending;
        }
        let n = buf.remaining().min(self.step);
        let mut small = ReadBuf::new(buf.initialize_unfilled_to(n));
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, &mut small))?;
        let got = small.filled().len();
        buf.advance(got);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.stalls(cx, 1) {
            return Poll::Pending;
        }
        let n = buf.len().min(self.step);
        let r = Pin::new(&mut self.inner).poll_write(cx, &buf[..n]);
        if matches!(r, Poll::Ready(Ok(_))) {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A server on one end of a pipe of `pipe` bytes; the other end is the client's.
struct Setup {
    client: DuplexStream,
    server: tokio::task::JoinHandle<Result<(), TransmissionError>>,
    device: Arc<MemDevice>,
    writes: Arc<AtomicUsize>,
    _shutdown: watch::Sender<bool>,
}

fn start(device: MemDevice, pipe: usize, step: usize) -> Setup {
    let (client, server_end) = tokio::io::duplex(pipe);
    let writes = Arc::new(AtomicUsize::new(0));
    let stream = Trickle {
        inner: server_end,
        step,
        stall: [false; 2],
        writes: Arc::clone(&writes),
    };
    let device = Arc::new(device);
    let (tx, rx) = watch::channel(false);
    let dev: Arc<dyn BlockDevice> = device.clone();
    let server = tokio::spawn(serve(stream, dev, rx));
    Setup {
        client,
        server,
        device,
        writes,
        _shutdown: tx,
    }
}

/// Let every task run until all are blocked.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

fn request(command: Command, handle: u64, offset: u64, length: u32) -> Vec<u8> {
    Request {
        flags: 0,
        command,
        handle,
        offset,
        length,
    }
    .encode()
    .to_vec()
}

fn write_request(handle: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut out = request(Command::Write, handle, offset, data.len() as u32);
    out.extend_from_slice(data);
    out
}

/// Read one reply; `reads` gives the length of each read request's data by handle.
async fn reply<R: AsyncRead + Unpin>(
    c: &mut R,
    reads: &HashMap<u64, u32>,
) -> (SimpleReply, Vec<u8>) {
    let mut header = [0u8; nbd::SIMPLE_REPLY_LEN];
    c.read_exact(&mut header).await.expect("reply header");
    let r = SimpleReply::decode(&header).expect("a simple reply");
    let mut data = Vec::new();
    if r.error == 0 {
        if let Some(&len) = reads.get(&r.handle) {
            data = vec![0; len as usize];
            c.read_exact(&mut data).await.expect("read data");
        }
    }
    (r, data)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn requests_and_replies_split_at_every_byte() {
    let mut s = start(MemDevice::new(), 1 << 20, 1);
    // A small write, a write large enough to be read straight into its buffer, reads of both.
    let small = pattern(1, 4096);
    let large = pattern(2, 96 * 1024);
    let mut wire = write_request(1, 0, &small);
    wire.extend(write_request(2, 64 * 1024, &large));
    wire.extend(request(Command::Flush, 3, 0, 0));
    wire.extend(request(Command::Read, 4, 0, 4096));
    wire.extend(request(Command::Read, 5, 64 * 1024, 96 * 1024));
    s.client.write_all(&wire).await.unwrap();
    let reads = HashMap::from([(4, 4096), (5, 96 * 1024)]);
    let mut got = HashMap::new();
    for _ in 0..5 {
        let (r, data) = reply(&mut s.client, &reads).await;
        assert_eq!(r.error, 0, "request {} failed", r.handle);
        got.insert(r.handle, data);
    }
    assert_eq!(got[&4], small);
    assert_eq!(got[&5], large);
    s.client
        .write_all(&request(Command::Disc, 6, 0, 0))
        .await
        .unwrap();
    s.server.await.unwrap().expect("a clean end after DISC");
    assert_eq!(s.device.finished.load(Ordering::SeqCst), 5);
}

#[tokio::test(start_paused = true)]
async fn a_short_read_from_the_device_fails_that_request_only() {
    let device = MemDevice {
        short_at: Some(8192),
        ..MemDevice::new()
    };
    let mut s = start(device, 1 << 20, 7);
    let mut wire = request(Command::Read, 1, 8192, 4096);
    wire.extend(request(Command::Read, 2, 0, 4096));
    s.client.write_all(&wire).await.unwrap();
    let reads = HashMap::from([(1, 4096), (2, 4096)]);
    let mut errors = HashMap::new();
    for _ in 0..2 {
        let (r, data) = reply(&mut s.client, &reads).await;
        if r.error == 0 {
            assert_eq!(data.len(), 4096);
        }
        errors.insert(r.handle, r.error);
    }
    // The short read would have shifted every later reply; it is an I/O error instead.
    assert_eq!(errors, HashMap::from([(1, nbd::EIO), (2, 0)]));
    drop(s.client);
    s.server
        .await
        .unwrap()
        .expect("a clean end at end of stream");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_stops_being_read() {
    // A pipe far smaller than the replies: the server's writes fill it at once.
    const PIPE: usize = 8192;
    let s = start(MemDevice::new(), PIPE, 64 * 1024);
    // More request bytes than the pipe holds plus what the server reads before its bound.
    let total = 1000;
    let (mut rx, mut tx) = tokio::io::split(s.client);
    let sender = tokio::spawn(async move {
        for h in 0..total as u64 {
            tx.write_all(&request(Command::Read, h, (h % 256) * 4096, 4096))
                .await
                .unwrap();
        }
        tx
    });
    settle().await;
    // Requests are answered only as far as replies can be written: the server stops at its
    // bound (a reply holds its slot until its last byte is in the pipe), so the client's
    // requests back up in its socket.
    let replies_in_pipe = PIPE / (nbd::SIMPLE_REPLY_LEN + 4096);
    assert_eq!(
        s.device.started.load(Ordering::SeqCst),
        MAX_IN_FLIGHT_REQUESTS + replies_in_pipe
    );
    assert!(!sender.is_finished(), "the server read every request");
    let reads: HashMap<u64, u32> = (0..total as u64).map(|h| (h, 4096)).collect();
    let mut handles = Vec::new();
    for _ in 0..total {
        let (r, data) = reply(&mut rx, &reads).await;
        assert_eq!((r.error, data.len()), (0, 4096));
        handles.push(r.handle);
    }
    handles.sort_unstable();
    assert_eq!(handles, (0..total as u64).collect::<Vec<_>>());
    let mut tx = sender.await.unwrap();
    tx.write_all(&request(Command::Disc, 0, 0, 0))
        .await
        .unwrap();
    s.server.await.unwrap().expect("a clean end");
    assert_eq!(s.device.started.load(Ordering::SeqCst), total);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_hangs_up_does_not_cancel_requests_in_flight() {
    let gate = Arc::new(Semaphore::new(0));
    let mut s = start(MemDevice::gated(&gate), 1 << 20, 1 << 20);
    let mut wire = Vec::new();
    for h in 0..10u64 {
        wire.extend(write_request(h, h * 4096, &pattern(h as u8, 4096)));
    }
    s.client.write_all(&wire).await.unwrap();
    settle().await;
    assert_eq!(s.device.started.load(Ordering::SeqCst), 10);
    drop(s.client);
    settle().await;
    // The client is gone, but writes already handed to the device are not dropped half-way:
    // the connection waits for them.
    assert!(
        !s.server.is_finished(),
        "the connection ended with writes in flight"
    );
    gate.add_permits(10);
    let end = s.server.await.unwrap();
    assert!(
        matches!(end, Ok(()) | Err(TransmissionError::Write(_))),
        "{end:?}"
    );
    assert_eq!(s.device.finished.load(Ordering::SeqCst), 10);
    assert_eq!(s.device.abandoned.load(Ordering::SeqCst), 0);
    let data = s.device.data.lock().unwrap();
    for h in 0..10usize {
        assert_eq!(
            data[h * 4096..(h + 1) * 4096],
            pattern(h as u8, 4096)[..],
            "write {h}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn replies_that_finish_together_leave_in_one_write() {
    let gate = Arc::new(Semaphore::new(0));
    let mut s = start(MemDevice::gated(&gate), 1 << 20, 1 << 20);
    let mut wire = Vec::new();
    for h in 0..16u64 {
        wire.extend(request(Command::Read, h, h * 4096, 4096));
    }
    s.client.write_all(&wire).await.unwrap();
    settle().await;
    assert_eq!(s.device.started.load(Ordering::SeqCst), 16);
    let before = s.writes.load(Ordering::SeqCst);
    gate.add_permits(16);
    let reads: HashMap<u64, u32> = (0..16).map(|h| (h, 4096)).collect();
    for _ in 0..16 {
        let (r, _) = reply(&mut s.client, &reads).await;
        assert_eq!(r.error, 0);
    }
    assert_eq!(
        s.writes.load(Ordering::SeqCst) - before,
        1,
        "16 replies ready at once took more than one write"
    );
    drop(s.client);
    s.server.await.unwrap().expect("a clean end");
}

#[tokio::test(start_paused = true)]
async fn only_a_request_alone_in_its_queue_is_called_alone() {
    let mut s = start(MemDevice::new(), 1 << 20, 1 << 20);
    let reads: HashMap<u64, u32> = (0..32).map(|h| (h, 4096)).collect();
    // Queue depth 1: each request is sent after the previous reply.
    for h in 0..4u64 {
        s.client
            .write_all(&request(Command::Read, h, h * 4096, 4096))
            .await
            .unwrap();
        assert_eq!(reply(&mut s.client, &reads).await.0.error, 0);
    }
    // Sixteen at once: none is alone, though the device finishes each in its first poll
    // (the engine would otherwise run them inline, one after another).
    let mut wire = Vec::new();
    for h in 16..32u64 {
        wire.extend(request(Command::Read, h, h * 4096, 4096));
    }
    s.client.write_all(&wire).await.unwrap();
    for _ in 16..32 {
        assert_eq!(reply(&mut s.client, &reads).await.0.error, 0);
    }
    let alone = s.device.alone.lock().unwrap().clone();
    assert_eq!(alone[..4], [true; 4]);
    assert_eq!(alone[4..], [false; 16]);
    drop(s.client);
    s.server.await.unwrap().expect("a clean end");
}

/// Polls `inner` and counts the wake-ups it gives its own task while being polled: tokio
/// requeues a task woken while it runs and wakes another worker thread to no purpose.
struct CountSelfWakes<F> {
    inner: Pin<Box<F>>,
    count: Arc<SelfWakes>,
}

#[derive(Default)]
struct SelfWakes {
    polling: std::sync::atomic::AtomicBool,
    during: AtomicUsize,
    task: futures_util::task::AtomicWaker,
}

impl futures_util::task::ArcWake for SelfWakes {
    fn wake_by_ref(me: &Arc<Self>) {
        if me.polling.load(Ordering::SeqCst) {
            me.during.fetch_add(1, Ordering::SeqCst);
        }
        me.task.wake();
    }
}

impl<F: Future> Future for CountSelfWakes<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.count.task.register(cx.waker());
        self.count.polling.store(true, Ordering::SeqCst);
        let waker = futures_util::task::waker(self.count.clone());
        let out = self.inner.as_mut().poll(&mut Context::from_waker(&waker));
        self.count.polling.store(false, Ordering::SeqCst);
        out
    }
}

#[tokio::test(start_paused = true)]
async fn a_lone_request_in_flight_does_not_wake_its_own_task() {
    let gate = Arc::new(Semaphore::new(0));
    let device = Arc::new(MemDevice::gated(&gate));
    let (mut client, server_end) = tokio::io::duplex(1 << 20);
    let (_tx, rx) = watch::channel(false);
    let dev: Arc<dyn BlockDevice> = device.clone();
    let count = Arc::new(SelfWakes::default());
    let server = tokio::spawn(CountSelfWakes {
        inner: Box::pin(serve(server_end, dev, rx)),
        count: count.clone(),
    });
    let reads: HashMap<u64, u32> = (0..4).map(|h| (h, 4096)).collect();
    for h in 0..4u64 {
        client
            .write_all(&request(Command::Read, h, h * 4096, 4096))
            .await
            .unwrap();
        settle().await;
        assert_eq!(device.started.load(Ordering::SeqCst), h as usize + 1);
        gate.add_permits(1);
        assert_eq!(reply(&mut client, &reads).await.0.error, 0);
    }
    assert_eq!(count.during.load(Ordering::SeqCst), 0);
    drop(client);
    server.await.unwrap().expect("a clean end");
}
