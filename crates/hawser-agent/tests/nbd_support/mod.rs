//! Shared fixtures for the NBD frontend tests: an in-memory block device that counts what it
//! is asked to do, a one-export registry, and a server running on TCP and a unix socket.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod raw_client;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use hawser_agent::frontends::block::{BlockDevice, ExportRegistry};
use hawser_agent::nbd::server::{serve_tcp, serve_unix};
use hawser_agent::observe::refusals::RefusalMetrics;
use hawser_core::IoError;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Name of the one export every test server has.
pub const EXPORT: &str = "vol";
/// Longest any single test step may take before the test fails instead of hanging.
pub const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// Fail the test if `fut` takes longer than `STEP_DEADLINE`.
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(STEP_DEADLINE, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what} did not finish within {STEP_DEADLINE:?}"),
    }
}

/// A RAM disk. `writes` counts every call that changes data; `calls` every call at all.
/// A closed gate holds every operation until it is opened, to pin requests in flight.
pub struct MemDevice {
    data: Mutex<Vec<u8>>,
    size: u64,
    pub writes: AtomicU64,
    pub calls: AtomicU64,
    pub flushes: AtomicU64,
    /// Write payloads that were not 4096-aligned in memory (must stay 0: replicas use O_DIRECT).
    pub misaligned_writes: AtomicU64,
    in_flight: AtomicUsize,
    pub max_in_flight: AtomicUsize,
    gate: watch::Sender<bool>,
    /// How long each request takes (`with_latency`); none by default.
    latency: Option<std::time::Duration>,
}

impl MemDevice {
    pub fn new(size: u64) -> Arc<MemDevice> {
        let len = usize::try_from(size).expect("test device size fits usize");
        Arc::new(MemDevice {
            // vec! of zeroes is calloc'd: untouched pages cost nothing.
            data: Mutex::new(vec![0u8; len]),
            size,
            writes: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            misaligned_writes: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            gate: watch::channel(true).0,
            latency: None,
        })
    }

    /// A device whose every request takes `latency`, like a disk: the server runs a request
    /// that completes in its first poll to its end before it reads the next header, so only
    /// a device that makes requests wait shows whether the server keeps many in flight.
    pub fn with_latency(size: u64, latency: std::time::Duration) -> Arc<MemDevice> {
        let mut d = Arc::into_inner(MemDevice::new(size)).expect("just made");
        d.latency = Some(latency);
        Arc::new(d)
    }

    pub fn close_gate(&self) {
        self.gate.send_replace(false);
    }

    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    pub fn snapshot(&self, offset: u64, len: u64) -> Vec<u8> {
        let r = self.range(offset, len).expect("snapshot within the device");
        self.lock()[r].to_vec()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count the call and wait at the gate; the returned guard marks it finished.
    async fn enter(&self) -> InFlight<'_> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let guard = InFlight(self);
        let mut gate = self.gate.subscribe();
        let _ = gate.wait_for(|&open| open).await;
        if let Some(latency) = self.latency {
            tokio::time::sleep(latency).await;
        }
        guard
    }

    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>, IoError> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.size)
            .ok_or(IoError::Invalid)?;
        let start = usize::try_from(offset).map_err(|_| IoError::Invalid)?;
        let end = usize::try_from(end).map_err(|_| IoError::Invalid)?;
        Ok(start..end)
    }

    fn zero(&self, offset: u64, len: u32) -> Result<(), IoError> {
        let r = self.range(offset, u64::from(len))?;
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.lock()[r].fill(0);
        Ok(())
    }
}

struct InFlight<'a>(&'a MemDevice);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait]
impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.size
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Bytes, IoError> {
        let _g = self.enter().await;
        let r = self.range(offset, u64::from(len))?;
        Ok(Bytes::copy_from_slice(&self.lock()[r]))
    }

    async fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Result<(), IoError> {
        let _g = self.enter().await;
        if !(data.as_ptr() as usize).is_multiple_of(4096) {
            self.misaligned_writes.fetch_add(1, Ordering::SeqCst);
        }
        let r = self.range(offset, data.len() as u64)?;
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.lock()[r].copy_from_slice(&data);
        Ok(())
    }

    async fn flush(&self) -> Result<(), IoError> {
        let _g = self.enter().await;
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), IoError> {
        let _g = self.enter().await;
        self.zero(offset, len)
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        _fua: bool,
        _trim: bool,
    ) -> Result<(), IoError> {
        let _g = self.enter().await;
        self.zero(offset, len)
    }
}

/// A registry with the single export `EXPORT`.
pub struct OneExport(pub Arc<MemDevice>);

impl ExportRegistry for OneExport {
    fn lookup(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        (name == EXPORT).then(|| Arc::clone(&self.0) as Arc<dyn BlockDevice>)
    }

    fn names(&self) -> Vec<String> {
        vec![EXPORT.to_owned()]
    }
}

/// A directory removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("hawser-nbd-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The NBD server on 127.0.0.1 (ephemeral port) and on a unix socket, both serving `device`
/// as `EXPORT`. Listeners are bound before the server starts, so clients never race it.
pub struct TestServer {
    pub tcp: SocketAddr,
    pub unix: PathBuf,
    pub device: Arc<MemDevice>,
    pub dir: TempDir,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(device: Arc<MemDevice>) -> TestServer {
        let dir = TempDir::new();
        let unix = dir.path().join("nbd.sock");
        let tcp_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tcp");
        let unix_listener = UnixListener::bind(&unix).expect("bind unix socket");
        let tcp = tcp_listener.local_addr().expect("tcp address");
        let registry: Arc<dyn ExportRegistry> = Arc::new(OneExport(Arc::clone(&device)));
        let (shutdown, rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(serve_tcp(
                tcp_listener,
                Arc::clone(&registry),
                None,
                RefusalMetrics::default(),
                rx.clone(),
            )),
            tokio::spawn(serve_unix(
                unix_listener,
                registry,
                RefusalMetrics::default(),
                rx,
            )),
        ];
        TestServer {
            tcp,
            unix,
            device,
            dir,
            shutdown,
            tasks,
        }
    }

    pub fn tcp_uri(&self) -> String {
        format!("nbd://{}/{EXPORT}", self.tcp)
    }

    pub fn unix_uri(&self) -> String {
        format!("nbd+unix:///{EXPORT}?socket={}", self.unix.display())
    }

    /// Ask the server to stop and wait until both listeners and all connections are done.
    pub async fn shutdown(self) {
        self.shutdown.send_replace(true);
        for task in self.tasks {
            within("server shutdown", task)
                .await
                .expect("server task panicked");
        }
    }

    /// Whether the accept loops are still running (they stop only on shutdown or panic).
    pub fn is_running(&self) -> bool {
        self.tasks.iter().all(|t| !t.is_finished())
    }
}

/// Whether `program` is on PATH; real-client tests skip (loudly) when it is not.
pub fn have(program: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
}
